"""Chat messages to a DeepSeek V4 prompt, as the released encoding_dsv4.py renders them.

The pipeline, in the format's own order:

    OpenAI messages --validate--> turns --merge tool results--> user turns with blocks
      --re-order results by call order--> --drop old developers (thinking)--> text

A turn is one message of the merged list. Tool messages become `tool_result` blocks of a user
turn; consecutive user/tool messages fuse into one user turn. Torch-free and I/O-free.

Rendering passes every piece of the client's text (contents, reasoning, call names and
arguments, tool schemas, response_format) through a `content` function: the identity for
`encode`, content marks for `encode_segments`, whose segments tell the client's text from
the format's own markup (BOS, EOS, User, Assistant, think tags, DSML tags, the tools text).

The steps the V4.1 format shares (server/v41_encoding.py) are public: `turns` (validate,
merge, attach the tools, order the results), and the renderings of a user turn's blocks,
a system turn's tools and response format, and an assistant's calls, in either format's
DSML tags (server/dsml_markup.py).

The one departure from the released encoder: a tool result's tags are plain text in the
format, so a result that held "</tool_result>" would close its block and could add
results of its own. In a result's text, a "<" that starts such a tag (either one, any
case, spaces allowed) is written "&lt;": a result can neither close its block nor open
another, and reads as the text it was.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from server import dsml_markup
from server.content_marks import ContentMarks, Segment
from server.dsml_markup import DSML, Markup

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
END_THINK = "</think>"
TOOL_CALLS_START = dsml_markup.V4.calls_start     # the "\n\n" belongs to the delimiter

V4_SPECIAL_TOKENS = (BOS, EOS, USER, ASSISTANT, THINK, END_THINK)

ROLES = ("system", "user", "assistant", "tool", "developer")
REASONING_EFFORTS = (None, "high", "max")

REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n")



@cache
def tools_template(markup: Markup) -> str:
    """The tools section of a system prompt in `markup`'s tags, "{schemas}" left to fill."""
    calls, invoke, param = (DSML + tag for tag in (markup.calls, markup.invoke,
                                                   markup.parameter))
    return f"""## Tools

You have access to a set of tools to help answer the user's question. \
You can invoke tools by writing a "<{calls}>" block like the following:

<{calls}>
<{invoke} name="$TOOL_NAME">
<{param} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{param}>
...
</{invoke}>
<{invoke} name="$TOOL_NAME2">
...
</{invoke}>
</{calls}>

String parameters should be specified as is and set `string="true"`. \
For all other types (numbers, booleans, arrays, objects), \
pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), \
you MUST output your complete reasoning inside <think>...</think> \
BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{{schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""


TOOLS_TEMPLATE = tools_template(dsml_markup.V4)

RESPONSE_FORMAT_HEADER = ("## Response Format:\n\n"
                          "You MUST strictly adhere to the following schema to reply:\n")
RESULT_TAG = re.compile(r"<(?=\s*/?\s*tool_result)", re.IGNORECASE)   # a result's tag starts


def to_json(value) -> str:
    """The format's JSON: non-ASCII kept, default separators (", " and ": ")."""
    return json.dumps(value, ensure_ascii=False)


def is_v4_vocab(token_to_id: Callable[[str], int | None]) -> bool:
    """Whether a tokenizer holds every V4 control string as a single token."""
    return all(token_to_id(token) is not None for token in V4_SPECIAL_TOKENS)


@dataclass(frozen=True)
class Call:
    """An assistant's tool call, its arguments already decoded to a dict."""

    id: str | None
    name: str
    arguments: dict


@dataclass(frozen=True)
class _Block:
    """One piece of a user turn: its text, or a tool's result (`result` set)."""

    text: str
    result: bool = False
    tool_use_id: str | None = None


@dataclass
class Turn:
    """One message of the merged list. `blocks` only on user turns; `reasoning` and `calls`
    only on assistant turns; `tools` and `response_format` only on the first system turn."""

    role: str
    text: str = ""
    blocks: list[_Block] = field(default_factory=list)
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)
    tools: list[dict] | None = None
    response_format: dict | None = None


def encode(messages: list[dict], *, thinking: bool, reasoning_effort: str | None = None,
           tools: list[dict] | None = None, response_format: dict | None = None) -> str:
    """The prompt text for `messages`, BOS first, exactly as the released encoder renders
    it with thinking_mode "thinking" (thinking=True) or "chat", drop_thinking left on.

    `tools` (OpenAI tools) and `response_format` ride on the first message if it is a system
    message, else on an empty system message put first. Raises ValueError on input the
    format cannot render (an unknown role, a content that is not text, a nameless call)."""
    return _encode(messages, thinking, reasoning_effort, tools, response_format, _same)


def encode_segments(messages: list[dict], *, thinking: bool,
                    reasoning_effort: str | None = None, tools: list[dict] | None = None,
                    response_format: dict | None = None) -> list[Segment]:
    """The text of `encode` as (text, is_markup) segments, joining to that text: the
    client's text is content, the format's own strings markup (for
    Tokenizer.encode_segments, which finds control tokens in markup only)."""
    marks = ContentMarks()
    segments = marks.split(_encode(messages, thinking, reasoning_effort, tools,
                                   response_format, marks.wrap))
    assert segments is not None, "each mark is written in a pair, and no client text holds one"
    return segments


def _same(text: str) -> str:
    return text


def _encode(messages, thinking: bool, reasoning_effort: str | None, tools, response_format,
            content: Callable[[str], str]) -> str:
    if reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {REASONING_EFFORTS}, "
                         f"not {reasoning_effort!r}")
    turns = to_turns(messages, tools, response_format)
    drop = not any(t.tools for t in turns)          # tools anywhere turn drop_thinking off
    if thinking and drop:
        turns = _drop_old_developers(turns)
    last = _last_user(turns)
    prefix = REASONING_EFFORT_MAX if thinking and reasoning_effort == "max" and turns else ""
    return BOS + prefix + "".join(_render(turns, i, last, thinking, drop, content)
                                  for i in range(len(turns)))


# --- validation: OpenAI dicts to turns ------------------------------------------------------

def to_turns(messages, tools, response_format,
             decode: Callable[[object], dict] | None = None) -> list[Turn]:
    """The merged turns of `messages`, the tools and response format on the first system
    turn, each user turn's results in call order. `decode`: a call's arguments to a
    dict (by default the V4 format's rule, `arguments`). ValueError on bad input."""
    decode = decode or arguments
    turns = _merge([_validate(m, i, decode) for i, m in enumerate(_list(messages))])
    _attach(turns, _functions(tools), response_format)
    _order_results(turns)
    return turns


def _list(messages) -> list:
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list, not {type(messages).__name__}")
    return messages


def _text(message: dict, key: str, where: str) -> str:
    value = message.get(key)
    if value is None or isinstance(value, str):
        return value or ""
    raise ValueError(f"{where}.{key} must be text or null, not {type(value).__name__}")


def _validate(message, i: int, decode: Callable[[object], dict]) -> Turn:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be an object, not {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}.role is {role!r}; expected one of {', '.join(ROLES)}")
    text = _text(message, "content", where)
    if role == "tool":
        tool_use_id = message.get("tool_call_id")
        if tool_use_id is not None and not isinstance(tool_use_id, str):
            raise ValueError(f"{where}.tool_call_id must be text")
        return Turn("tool", blocks=[_Block(text, result=True, tool_use_id=tool_use_id)])
    if role == "user":
        return Turn("user", blocks=[_Block(text)])
    if role == "assistant":
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ValueError(f"{where}.tool_calls must be a list")
        return Turn("assistant", text, reasoning=_text(message, "reasoning_content", where),
                     calls=[_call(c, f"{where}.tool_calls[{j}]", decode)
                            for j, c in enumerate(calls)])
    return Turn(role, text)


def _call(call, where: str, decode: Callable[[object], dict]) -> Call:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    call_id = call.get("id")
    return Call(call_id if isinstance(call_id, str) else None, name,
                decode(function.get("arguments")))


def arguments(raw) -> dict:
    """A call's arguments as the format reads them: the JSON object, or
    {"arguments": raw} when the text is not a JSON object."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return {"arguments": to_json(raw)}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": raw}


def _functions(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    functions = [t.get("function") if isinstance(t, dict) else None for t in tools]
    for i, function in enumerate(functions):
        if not isinstance(function, dict):
            raise ValueError(f"tools[{i}].function must be an object")
    return functions or None


# --- preprocessing ---------------------------------------------------------------------------

def _merge(turns: list[Turn]) -> list[Turn]:
    """Tool and user turns join a user turn right before them; a tool turn with none
    becomes a user turn of its own."""
    merged: list[Turn] = []
    for turn in turns:
        if turn.role in ("user", "tool") and merged and merged[-1].role == "user":
            merged[-1].blocks.extend(turn.blocks)
        else:
            merged.append(Turn("user", blocks=turn.blocks) if turn.role == "tool" else turn)
    return merged


def _attach(turns: list[Turn], tools: list[dict] | None, response_format) -> None:
    if not tools and not response_format:
        return
    if not turns or turns[0].role != "system":
        turns.insert(0, Turn("system"))
    turns[0].tools, turns[0].response_format = tools, response_format


def _order_results(turns: list[Turn]) -> None:
    """Tool results of a user turn, in their own slots, sorted by the position of their
    call in the latest earlier assistant turn (unknown ids count as position 0)."""
    rank: dict[str, int] = {}
    for turn in turns:
        if turn.role == "assistant":
            rank = _positions(turn.calls)
        slots = [j for j, b in enumerate(turn.blocks) if b.result]
        if len(slots) < 2:
            continue
        ordered = sorted((turn.blocks[j] for j in slots),
                         key=lambda b: rank.get(b.tool_use_id, 0))
        for j, block in zip(slots, ordered):
            turn.blocks[j] = block


def _positions(calls: list[Call]) -> dict[str, int]:
    """Call id -> its position among the calls; a repeated id keeps its first position."""
    positions: dict[str, int] = {}
    for n, call in enumerate(calls):
        if call.id is not None:
            positions.setdefault(call.id, n)
    return positions


def _last_user(turns: list[Turn]) -> int:
    """Index of the last user or developer turn; -1 when there is none."""
    return max((i for i, t in enumerate(turns) if t.role in ("user", "developer")), default=-1)


def _drop_old_developers(turns: list[Turn]) -> list[Turn]:
    """Thinking with drop_thinking: developer turns before the last user/developer turn go.
    (Earlier assistants lose their reasoning too, which _render does by not writing it.)"""
    last = _last_user(turns)
    return [t for i, t in enumerate(turns) if not (t.role == "developer" and i < last)]


# --- rendering: `content` wraps each piece of the client's text --------------------------------

def _render(turns: list[Turn], i: int, last: int, thinking: bool, drop: bool,
            content: Callable[[str], str]) -> str:
    turn = turns[i]
    if turn.role == "system":
        return content(turn.text) + render_suffix(turn, content)
    if turn.role == "assistant":
        thinks = thinking and (not drop or i > last)
        thought = content(turn.reasoning) + END_THINK if thinks else ""
        return thought + content(turn.text) + render_calls(turn.calls, content) + EOS
    body = USER + (content(turn.text) + render_suffix(turn, content)
                   if turn.role == "developer" else render_blocks(turn, content))
    if i + 1 < len(turns) and turns[i + 1].role != "assistant":
        return body
    return body + ASSISTANT + (THINK if thinking and (not drop or i >= last) else END_THINK)


def render_suffix(turn: Turn, content: Callable[[str], str],
                  markup: Markup = dsml_markup.V4) -> str:
    """What follows a system (or developer) turn's text: its tools, its response format."""
    text = ""
    if turn.tools:
        text += "\n\n" + tools_template(markup).format(
            schemas="\n".join(content(to_json(f)) for f in turn.tools))
    if turn.response_format:
        text += "\n\n" + RESPONSE_FORMAT_HEADER + content(to_json(turn.response_format))
    return text


def render_blocks(turn: Turn, content: Callable[[str], str]) -> str:
    """A user turn's text and tool results, "\\n\\n" between them."""
    return "\n\n".join(f"<tool_result>{content(_result(b.text))}</tool_result>" if b.result
                       else content(b.text) for b in turn.blocks)


def _result(text: str) -> str:
    """A tool result's text, unable to write its block's tags."""
    return RESULT_TAG.sub("&lt;", text)


def render_calls(calls: list[Call], content: Callable[[str], str],
                 markup: Markup = dsml_markup.V4) -> str:
    """An assistant's calls as one block after "\\n\\n"; "" without calls."""
    if not calls:
        return ""
    invokes = "\n".join(_invoke(c, content, markup) for c in calls)
    return f"{markup.calls_start}>\n{invokes}\n{markup.calls_close}"


def _invoke(call: Call, content: Callable[[str], str], markup: Markup) -> str:
    params = "\n".join(_parameter(k, v, content, markup) for k, v in call.arguments.items())
    return f'{markup.invoke_open}{content(call.name)}">\n{params}\n{markup.invoke_close}'


def _parameter(key: str, value, content: Callable[[str], str], markup: Markup) -> str:
    is_text = isinstance(value, str)
    text = value if is_text else to_json(value)
    return (f'{markup.param_open}{content(key)}" '
            f'string="{"true" if is_text else "false"}">{content(text)}{markup.param_close}')
