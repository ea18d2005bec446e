"""The grammar of a chat output in tool_choice "auto": free text, and DSML tool-call blocks
held to the request's tools (llguidance Lark; runtime/text/grammar.py compiles it).

Outside a block the text is free. Once the model opens one (`<｜DSML｜tool_calls`), the rest
of the block is the format's grammar (server/v4_output.Block) over the request's tools,
here in V4's tags (V4.1's put a space before each name and call the block " calls":
server/dsml_markup.py; `markup` picks them):

    >  { <｜DSML｜invoke name="TOOL">
           { <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter> }
         </｜DSML｜invoke> }
    </｜DSML｜tool_calls>

A tool's parameters come in the order its schema lists them, each at most once, the
required ones always. A value is written as the released encoder writes it: a string as
its raw text (string="true"; any text, a string's other keywords are not enforced),
anything else as JSON (string="false") valid against the parameter's schema; a parameter
whose schema admits both may take either. A parameter whose schema lists its values
(enum, const) takes one of them: a string as its raw text, unless it holds "｜DSML｜" (the
text of every delimiter of a block): such a string is written as a JSON string with "<",
">" and "｜" escaped, so that a value can never write a delimiter (a tool's schema may come
from a third party) and reads back as itself (server/v4_output.py reads JSON values).
A tool without a parameters schema takes any parameters (names the grammar allows, JSON or
text values). Tools and parameters whose names the format cannot write are left out.

Without parallel calls, an output holds one block of one call.

Where the tools' schemas do not compile (a keyword llguidance refuses, an unsatisfiable
range), the request falls back to the names-only grammar (`schemas=False`): an agent's
sloppy schema costs it the argument checks, never the request.

"｜DSML｜" is one added token in a V4 vocabulary, which llguidance reads as a special
token: there the markup is written with that token, and no text may spell its text
either (around the blocks, in text values and names; as runtime/text/grammar.Reasoning
does for "</think>"), but inside the strings of a JSON value, which the parser reads past:
so every "｜DSML｜" a text-level reader meets is the token. In a vocabulary without it, the
markup is text, and free text may not hold a block's opening but as a block.
"""
from __future__ import annotations

import json

from server import dsml_markup
from server.dsml_markup import DSML, Markup

# between the tags of a block: the newlines the format writes (one; two in a call without
# parameters). The parser takes any whitespace there; a constrained model free to add
# whitespace can spend its whole budget on it.
SPACE = r"/\n{0,2}/"
NAME = r'[^"<>\n]+'              # a name ends at '"'; the others break the grammar
UNWRITABLE = '"<>\n'             # characters a name of the format cannot hold
TEXT_KIND = json.dumps('" string="true">')       # after a parameter's name: its value's kind
JSON_KIND = json.dumps('" string="false">')
# JSON text with the characters of the format's delimiters escaped (they occur in strings
# only, where an escape reads as the character)
ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "｜": "\\uff5c"})


class DsmlGrammar:
    """The Lark text of one request's auto-mode grammar. `dsml_id`: the vocabulary's
    "｜DSML｜" token, or None when the markup is text; `parallel`: an output may hold
    more than one call; `markup`: the format's tags."""

    def __init__(self, tools: list[dict], dsml_id: int | None, parallel: bool = True,
                 schemas: bool = True, markup: Markup = dsml_markup.V4):
        self.tools, self.dsml_id, self.parallel = tools, dsml_id, parallel
        self.schemas = schemas         # False: tool names only, any parameters
        self.markup = markup
        self.rules: list[str] = []

    def lark(self) -> str:
        m = self.markup
        free = _without(r"(?s:.*)", DSML if self.dsml_id is not None else m.calls_open)
        calls = [self._tool(i, t) for i, t in enumerate(self.tools)
                 if isinstance(t.get("name"), str) and _writable(t["name"])]
        calls = [c for c in calls if c is not None]
        if not calls:                  # nothing the format can call: the output is text
            return f"%llguidance {{}}\nstart: TEXT\nTEXT: {free}\n"
        repeat, blocks = ("+", "*") if self.parallel else ("", "?")
        block = f'block: ">" ({SPACE} call){repeat} {SPACE} {self._mark("</", m.calls + ">")}'
        return "\n".join(["%llguidance {}", f"start: (head block){blocks} TEXT", self._head(),
                          block, f"call: {' | '.join(calls)}", f"TEXT: {free}",
                          self._text_value_rule(), f"PARAM_NAME: {_without(NAME, DSML)}",
                          *self.rules]) + "\n"

    def _mark(self, before: str, after: str) -> str:
        """The markup `before` ｜DSML｜ `after` as grammar: literals around the token, or one
        literal."""
        if self.dsml_id is None:
            return json.dumps(before + DSML + after)
        return " ".join(p for p in (_literal(before), f"<[{self.dsml_id}]>", _literal(after))
                        if p)

    def _head(self) -> str:
        """Free text up to the block's opening: with the token, text that ends with "<"
        (and spells no "｜DSML｜") and the token after it; as text, the shortest text that
        ends with the opening (a lazy lexeme)."""
        if self.dsml_id is None:
            return f"head[lazy]: /(?s:.*){_regex(self.markup.calls_open)}/"
        return f"head: HEAD <[{self.dsml_id}]> {json.dumps(self.markup.calls)}\n" \
               f"HEAD: {_without('(?s:.*)<', DSML)}"

    def _text_value_rule(self) -> str:
        """Any raw text value and its close: as text, the shortest text that ends with the
        close (lazy); with the token, text up to "</" (that spells no "｜DSML｜") and the
        token."""
        if self.dsml_id is None:
            return f"text_value[lazy]: /(?s:.*){_regex(self.markup.param_close)}/"
        close = json.dumps(self.markup.parameter + ">")
        return f"text_value: TEXT_VALUE <[{self.dsml_id}]> {close}\n" \
               f"TEXT_VALUE: {_without('(?s:.*)</', DSML)}"

    def _tool(self, index: int, tool: dict) -> str | None:
        """The rule of one tool's invoke, or None where a required parameter can take
        no value the format can write."""
        rule = f"tool_{index}"
        schema = tool.get("parameters")
        params = self._params(rule, schema) if self.schemas and _has_properties(schema) \
            else self._any(rule)
        if params is None:
            return None
        invoke = self.markup.invoke
        opening = self._mark("<", f'{invoke} name="{tool["name"]}">')
        self.rules.append(f'{rule}: {opening} {params} {SPACE} {self._mark("</", invoke + ">")}')
        return rule

    def _params(self, rule: str, schema: dict) -> str | None:
        required = schema.get("required")
        required = set(r for r in required if isinstance(r, str)) \
            if isinstance(required, list) else set()
        parts = []
        for n, (key, sub) in enumerate(schema["properties"].items()):
            if not key or not _writable(key):
                continue                         # a name the format cannot write
            param = self._param(key, sub)
            if param is None:                    # no value it can take
                if key in required:
                    return None
                continue
            name = f"{rule}_p{n}"
            self.rules.append(f"{name}: {SPACE} {param}")
            parts.append(name if key in required else f"{name}?")
        return " ".join(parts)

    def _any(self, rule: str) -> str:
        """Any parameters: a name, then a text or a JSON value."""
        name = f"{rule}_any"
        opening = self._mark("<", f'{self.markup.parameter} name="')
        self.rules.append(f"{name}: {SPACE} {opening} PARAM_NAME ({TEXT_KIND} text_value"
                          f" | {JSON_KIND} %json {{}} {self._close()})")
        return f"{name}*"

    def _param(self, key: str, schema) -> str | None:
        """One parameter, as the value's schema allows it to be written (None: it allows
        no value)."""
        opening = self._mark("<", f'{self.markup.parameter} name="{key}')
        listed = _listed(schema)
        if listed is not None:
            texts = [v for v in listed if isinstance(v, str) and DSML not in v]
            others = [j for v in listed if not isinstance(v, str) or DSML in v
                      if (j := _json_text(v)) is not None]
            kinds = [f"{kind} ({' | '.join(json.dumps(v) for v in values)}) {self._close()}"
                     for kind, values in ((TEXT_KIND, texts), (JSON_KIND, others)) if values]
            return f"{opening} ({' | '.join(kinds)})" if kinds else None
        kinds = []
        if _may_be_string(schema):
            kinds.append(f"{TEXT_KIND} text_value")
        if _may_be_other(schema):
            value = json.dumps(schema if isinstance(schema, dict) else {})
            kinds.append(f"{JSON_KIND} %json {value} {self._close()}")
        return f"{opening} ({' | '.join(kinds)})"

    def _close(self) -> str:
        return self._mark("</", self.markup.parameter + ">")


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def _regex(text: str) -> str:
    """`text` as a regex of itself, inside a Lark /.../."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$/" else c for c in text)


def _without(regex: str, text: str) -> str:
    """A Lark lexeme: what `regex` matches that does not hold `text`."""
    return f"/{_regex_slashes(regex)}/ & ~/(?s:.*){_regex(text)}(?s:.*)/"


def _regex_slashes(regex: str) -> str:
    return regex.replace("/", "\\/")


def _writable(name: str) -> bool:
    """Whether the format can write `name`: none of its stops, and no "｜DSML｜" (which
    free text may not spell where it is a token)."""
    return not any(c in name for c in UNWRITABLE) and DSML not in name


def _json_text(value) -> str | None:
    """`value` as the format's JSON (", " and ": "), its delimiters' characters escaped;
    None for a value JSON cannot write (NaN, infinities) or too deep to write."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).translate(ESCAPES)
    except (ValueError, RecursionError):
        return None


def _has_properties(schema) -> bool:
    return isinstance(schema, dict) and isinstance(schema.get("properties"), dict)


def _types(schema) -> set[str] | None:
    """The JSON types a schema admits, where it says (None: any)."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        kind = [kind]
    if isinstance(kind, list):
        return {"string" if k == "string" else "other" for k in kind}
    return None


def _listed(schema) -> list | None:
    """The values a schema's enum or const allows, where it lists them (None: it does
    not; the values' JSON type is the one they are written as)."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list):
        return schema["enum"]
    return [schema["const"]] if "const" in schema else None


def _may_be_string(schema) -> bool:
    types = _types(schema)
    return types is None or "string" in types


def _may_be_other(schema) -> bool:
    types = _types(schema)
    return types is None or "other" in types
