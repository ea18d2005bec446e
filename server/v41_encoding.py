"""Chat messages to a DeepSeek V4.1 prompt, as the release's encoding/encoding.py renders them.

Where the facts come from: the official encoder of deepseek-ai/DeepSeek-V4.1-Flash
(encoding/encoding.py, read in its unmodified vendored copy, ztxz16/fastllm
tools/fastllm_pytools/encoding_dsv41.py). vLLM (vllm/tokenizers/deepseek_v41_encoding.py)
and SGLang (encoding_dsv41.py) render alike, but for the effort tiers, which they took from
a pre-release drop (low 25, high 50, xhigh 75, max 100).

The format is V4's (server/v4_encoding.py: turns merged, tool results in call order, tools
and response format on the first system turn, earlier reasoning and developer turns dropped
in thinking mode unless tools are given) with these changes:

- DSML tags carry a leading space: "<｜DSML｜ calls>", "<｜DSML｜ invoke name=...>",
  "<｜DSML｜ parameter ...>" (server/dsml_markup.V41), in the tools section as in the calls.
- "<｜System｜>" opens a system turn. The first turn opens with it when it is a system turn
  or when the effort line stands before it. A system turn after the first is a turn of its
  own that counts as a user turn: it can be the last user turn, and the assistant's
  header follows it when it ends the prompt.
- Reasoning effort, in thinking mode only, is one line after the first "<｜System｜>":
  "Reasoning Effort: N (range 1-100, the higher the value, the more thorough the
  reasoning)" and a blank line; N is an integer in 1..100 or a tier: low 50, high 75,
  max 100, by default high. Chat mode writes no line (the effort is still checked).
- Image content blocks are "<｜deepseek_image｜>" placeholders (v4serve serves the text
  model and refuses image parts: server/chat.py).
- A call's arguments given as JSON text are decoded up to twice (a doubly encoded object).

As vLLM renders it (the official encoder knows no such role): a developer turn is V4's,
"<｜User｜>" with its text, tools and response format, and counts as a user turn. As in
V4, a tool result cannot write its block's tags (server/v4_encoding.py's one departure).
Torch-free and I/O-free.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from server import dsml_markup
from server import v4_encoding as v4
from server.content_marks import ContentMarks, Segment
from server.v4_encoding import ASSISTANT, BOS, END_THINK, EOS, THINK, USER, Turn

SYSTEM = "<｜System｜>"
V41_SPECIAL_TOKENS = (*v4.V4_SPECIAL_TOKENS, SYSTEM)
MARKUP = dsml_markup.V41

EFFORTS = {"low": 50, "high": 75, "max": 100}      # the format's tiers, as numeric budgets
DEFAULT_EFFORT = "high"
EFFORT_LINE = ("Reasoning Effort: {} (range 1-100, the higher the value, the more thorough "
               "the reasoning)\n\n")

Effort = str | int | None


def is_v41_vocab(token_to_id: Callable[[str], int | None]) -> bool:
    """Whether a tokenizer holds every V4.1 control string as a single token."""
    return all(token_to_id(token) is not None for token in V41_SPECIAL_TOKENS)


def budget(effort: Effort) -> int:
    """The numeric budget of a reasoning effort: a tier's (None: the default tier's), or
    an integer in 1..100 itself. ValueError for anything else."""
    if effort is None:
        effort = DEFAULT_EFFORT
    if isinstance(effort, str) and effort in EFFORTS:
        return EFFORTS[effort]
    if type(effort) is int and 1 <= effort <= 100:        # a bool is no budget
        return effort
    raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORTS)} or an integer "
                     f"from 1 to 100, not {effort!r}")


def arguments(raw) -> dict:
    """A call's arguments as the format reads them: the JSON object (its text decoded up
    to twice), else {"arguments": raw}; None is no arguments."""
    if raw is None:
        return {}
    value = raw
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            break
    return value if isinstance(value, dict) else {"arguments": raw}


def encode(messages: list[dict], *, thinking: bool, reasoning_effort: Effort = None,
           tools: list[dict] | None = None, response_format: dict | None = None) -> str:
    """The prompt text for `messages`, BOS first, as the released encoder renders it with
    thinking_mode "thinking" (thinking=True) or "chat", drop_thinking left on.

    `tools` (OpenAI tools) and `response_format` ride on the first message if it is a system
    message, else on an empty system message put first. Raises ValueError on input the
    format cannot render (an unknown role or effort, a content that is not text)."""
    return _encode(messages, thinking, reasoning_effort, tools, response_format, _same)


def encode_segments(messages: list[dict], *, thinking: bool, reasoning_effort: Effort = None,
                    tools: list[dict] | None = None,
                    response_format: dict | None = None) -> list[Segment]:
    """The text of `encode` as (text, is_markup) segments: the client's text is content,
    the format's own strings (the effort line among them) markup."""
    marks = ContentMarks()
    segments = marks.split(_encode(messages, thinking, reasoning_effort, tools,
                                   response_format, marks.wrap))
    assert segments is not None, "each mark is written in a pair, and no client text holds one"
    return segments


def _same(text: str) -> str:
    return text


def _encode(messages, thinking: bool, effort: Effort, tools, response_format,
            content: Callable[[str], str]) -> str:
    tier = budget(effort)                  # checked in chat mode too, as the encoder does
    line = EFFORT_LINE.format(tier) if thinking else ""
    turns = v4.to_turns(messages, tools, response_format, decode=arguments)
    drop = not any(t.tools for t in turns)          # tools anywhere turn drop_thinking off
    if thinking and drop:
        turns = _drop_old_developers(turns)
    last = _last_user(turns)
    return BOS + "".join(_opening(turns[i], i, line)
                         + _body(turns[i], i, last, thinking, drop, content)
                         + _header(turns, i, last, thinking, drop)
                         for i in range(len(turns)))


def _last_user(turns: list[Turn]) -> int:
    """Index of the last user, developer or later system turn; -1 when there is none."""
    return max((i for i, t in enumerate(turns)
                if t.role in ("user", "developer") or (t.role == "system" and i > 0)),
               default=-1)


def _drop_old_developers(turns: list[Turn]) -> list[Turn]:
    """Thinking with drop_thinking: developer turns before the last user turn go.
    (Earlier assistants lose their reasoning too, which _body does by not writing it.)"""
    last = _last_user(turns)
    return [t for i, t in enumerate(turns) if not (t.role == "developer" and i < last)]


# --- rendering: `content` wraps each piece of the client's text --------------------------------

def _opening(turn: Turn, i: int, line: str) -> str:
    """Before the first turn: "<｜System｜>" and the effort line, when either is due."""
    return SYSTEM + line if i == 0 and (line or turn.role == "system") else ""


def _body(turn: Turn, i: int, last: int, thinking: bool, drop: bool,
          content: Callable[[str], str]) -> str:
    if turn.role == "system":
        return (SYSTEM if i > 0 else "") + content(turn.text) + \
            v4.render_suffix(turn, content, MARKUP)
    if turn.role == "assistant":
        thinks = thinking and (not drop or i > last)
        thought = content(turn.reasoning) + END_THINK if thinks else ""
        return thought + content(turn.text) + v4.render_calls(turn.calls, content, MARKUP) + EOS
    if turn.role == "developer":
        return USER + content(turn.text) + v4.render_suffix(turn, content, MARKUP)
    return USER + v4.render_blocks(turn, content)


def _header(turns: list[Turn], i: int, last: int, thinking: bool, drop: bool) -> str:
    """The assistant's turn to speak, after a user, developer or later system turn that
    ends the prompt or is answered by an assistant turn."""
    turn = turns[i]
    asks = turn.role in ("user", "developer") or (turn.role == "system" and i > 0)
    if not asks or (i + 1 < len(turns) and turns[i + 1].role != "assistant"):
        return ""
    return ASSISTANT + (THINK if thinking and (not drop or i >= last) else END_THINK)
