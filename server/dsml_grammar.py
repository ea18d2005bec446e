"""The grammar of a chat output in tool_choice "auto": free text, and DSML tool-call blocks
held to the request's tools (llguidance Lark; runtime/text/grammar.py compiles it).

Outside a block the text is free. Once the model opens one (`<｜DSML｜tool_calls`), the rest
of the block is the format's grammar (server/v4_output.Block) over the request's tools:

    >  { <｜DSML｜invoke name="TOOL">
           { <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter> }
         </｜DSML｜invoke> }
    </｜DSML｜tool_calls>

A tool's parameters come in the order its schema lists them, each at most once, the
required ones always. A value is written as the released encoder writes it: a string as
its raw text (string="true"; one of its enum's strings where the schema lists them, else
any text: a string's other keywords are not enforced), anything else as JSON
(string="false") valid against the parameter's schema; a parameter whose schema admits
both may take either. A tool without
a parameters schema takes any parameters (names the grammar allows, JSON or text values).

Where the tools' schemas do not compile (a keyword llguidance refuses, an unsatisfiable
range), the request falls back to the names-only grammar (`schemas=False`): an agent's
sloppy schema costs it the argument checks, never the request.

"｜DSML｜" is one added token in a V4 vocabulary, which llguidance reads as a special
token: there the markup is written with that token, and free text cannot spell it; in a
vocabulary without it, the markup is text.
"""
from __future__ import annotations

import json

from server.v4_encoding import DSML

# between the tags of a block: the newlines the format writes (one; two in a call without
# parameters). The parser takes any whitespace there; a constrained model free to add
# whitespace can spend its whole budget on it.
SPACE = r"/\n{0,2}/"
NAME = r'/[^"<>\n]+/'            # a name ends at '"'; the others break the grammar
TEXT_KIND = json.dumps('" string="true">')       # after a parameter's name: its value's kind
JSON_KIND = json.dumps('" string="false">')


class DsmlGrammar:
    """The Lark text of one request's auto-mode grammar. `dsml_id`: the vocabulary's
    "｜DSML｜" token, or None when the markup is text; `parallel`: a block may hold more
    than one call."""

    def __init__(self, tools: list[dict], dsml_id: int | None, parallel: bool = True,
                 schemas: bool = True):
        self.tools, self.dsml_id, self.parallel = tools, dsml_id, parallel
        self.schemas = schemas         # False: tool names only, any parameters
        self.rules: list[str] = []

    def lark(self) -> str:
        calls = " | ".join(self._tool(i, t) for i, t in enumerate(self.tools))
        repeat = "+" if self.parallel else ""
        block = f'block: ">" ({SPACE} call){repeat} {SPACE} {self._mark("</", "tool_calls>")}'
        head = self._head()
        text_value = f"text_value[lazy]: /(?s:.*){_regex(f'</{DSML}parameter>')}/"
        return "\n".join(["%llguidance {}", "start: (head block)* TEXT", head, block,
                          f"call: {calls}", "TEXT: /(?s:.*)/", text_value, *self.rules]) + "\n"

    def _mark(self, before: str, after: str) -> str:
        """The markup `before` ｜DSML｜ `after` as grammar: literals around the token, or one
        literal."""
        if self.dsml_id is None:
            return json.dumps(before + DSML + after)
        return " ".join(p for p in (_literal(before), f"<[{self.dsml_id}]>", _literal(after))
                        if p)

    def _head(self) -> str:
        """Free text up to the block's opening: with the token, the text ends with "<" and
        the token follows (free text cannot hold the token); as text, the shortest text
        that ends with the opening (a lazy lexeme)."""
        if self.dsml_id is None:
            opening = _regex(f"<{DSML}tool_calls")
            return f"head[lazy]: /(?s:.*){opening}/"
        return f"head: /(?s:.*)</ <[{self.dsml_id}]> \"tool_calls\""

    def _tool(self, index: int, tool: dict) -> str:
        """The rule of one tool's invoke; its name."""
        rule = f"tool_{index}"
        schema = tool.get("parameters")
        params = self._params(rule, schema) if self.schemas and _has_properties(schema) \
            else self._any(rule)
        opening = self._mark("<", f'invoke name="{tool["name"]}">')
        self.rules.append(f'{rule}: {opening} {params} {SPACE} {self._mark("</", "invoke>")}')
        return rule

    def _params(self, rule: str, schema: dict) -> str:
        required = set(schema.get("required") or ())
        parts = []
        for n, (key, sub) in enumerate(schema["properties"].items()):
            if not key or any(c in key for c in '"<>\n'):
                continue                         # a name the format cannot write
            name = f"{rule}_p{n}"
            self.rules.append(f"{name}: {SPACE} {self._param(key, sub)}")
            parts.append(name if key in required else f"{name}?")
        return " ".join(parts) if parts else ""

    def _any(self, rule: str) -> str:
        """Any parameters: a name, then a text or a JSON value."""
        name = f"{rule}_any"
        opening = self._mark("<", 'parameter name="')
        self.rules.append(f"{name}: {SPACE} {opening} {NAME} ({TEXT_KIND} {self._text_value()}"
                          f" | {JSON_KIND} %json {{}} {self._close()})")
        return f"{name}*"

    def _param(self, key: str, schema) -> str:
        """One parameter, as the value's schema allows it to be written."""
        opening = self._mark("<", f'parameter name="{key}')
        kinds = []
        if _may_be_string(schema):
            kinds.append(f"{TEXT_KIND} {self._text_value(_strings(schema))}")
        if _may_be_other(schema):
            value = json.dumps(schema if isinstance(schema, dict) else {})
            kinds.append(f"{JSON_KIND} %json {value} {self._close()}")
        return f"{opening} ({' | '.join(kinds)})"

    def _text_value(self, choices: list[str] | None = None) -> str:
        """A raw text value and the parameter's close: one of `choices` (a schema's string
        enum) then the close, or any text: the shortest text that ends with the close
        (lazy), or, with the token, text up to "</" and the token."""
        if choices:
            return f"({' | '.join(json.dumps(c) for c in choices)}) {self._close()}"
        if self.dsml_id is None:
            return "text_value"
        return f"/(?s:.*)<\\// <[{self.dsml_id}]> \"parameter>\""

    def _close(self) -> str:
        return self._mark("</", "parameter>")


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def _regex(text: str) -> str:
    """`text` as a regex of itself, inside a Lark /.../."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$/" else c for c in text)


def _has_properties(schema) -> bool:
    return isinstance(schema, dict) and isinstance(schema.get("properties"), dict)


def _types(schema) -> set[str] | None:
    """The JSON types a schema admits, where it says (None: any)."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema and isinstance(schema["enum"], list):
        return {"string" if isinstance(v, str) else "other" for v in schema["enum"]}
    if "const" in schema:
        return {"string" if isinstance(schema["const"], str) else "other"}
    kind = schema.get("type")
    if isinstance(kind, str):
        kind = [kind]
    if isinstance(kind, list):
        return {"string" if k == "string" else "other" for k in kind}
    return None


def _strings(schema) -> list[str] | None:
    """The strings a schema's enum or const allows, where those are all it allows."""
    if not isinstance(schema, dict):
        return None
    values = schema["enum"] if isinstance(schema.get("enum"), list) else \
        [schema["const"]] if "const" in schema else None
    if values is None or not all(isinstance(v, str) for v in values):
        return None
    return values or None


def _may_be_string(schema) -> bool:
    types = _types(schema)
    return types is None or "string" in types


def _may_be_other(schema) -> bool:
    types = _types(schema)
    return types is None or "other" in types
