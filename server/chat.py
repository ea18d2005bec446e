"""A chat request as the engine runs it: the prompt, and how its output is to be read.

The prompt: a DeepSeek checkpoint is encoded by its family's chat format, V4's
(server/v4_encoding.py) or V4.1's (server/v41_encoding.py), where its tokenizer carries the
format's special tokens: thinking or not, reasoning effort, tools and tool calls in DSML.
The family is the spec's (ModelArgs.family: a V4.1 config is model_type
deepseek_v41_text), else the parser flags' (deepseek_v4 or deepseek_v41), else V4; a
parser of the other family's format is refused when the server starts. Any other
checkpoint uses its Jinja chat template (given `tools`, `thinking` and the request's
chat_template_kwargs), or a plain fallback. Either way the client's text is tokenized as
plain text: only the renderer's own markup yields control tokens
(server/content_marks.py), so a message, a tool definition or a template argument cannot
forge a turn or a tool call.

The reading (ChatPlan): whether the prompt opened a thinking block, which tool mode the
request is in, and the constraint its output is sampled under:

    tool_choice  none      tools are not shown; the output is text
                 auto      tools are shown; DSML calls in the output are parsed (needs
                           --enable-auto-tool-choice and --tool-call-parser), and once
                           the model opens a call block, the block is held to the tools
                           (server/dsml_grammar.py); the text around it is free
                 required  the output is a JSON array of {name, parameters} calls
                 named     the output is the named function's arguments (JSON)

A call the output makes is read only if it names one of the request's tools, and one at
most with parallel_tool_calls false (the grammars hold the output to that, and the readers
hold to it whatever the text).

A thinking prompt's output is free reasoning first: a constraint (a response_format,
guided_*, tool_choice required or named) applies from the end of the reasoning block, and
a reasoning budget (`thinking_token_budget`, vLLM's name) forces that end after so many
tokens of reasoning (runtime/text/grammar.Reasoning). Without a reasoning parser the
reasoning would be read as the constrained content, so a constrained request is then
rendered without thinking.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from types import ModuleType

from jinja2.sandbox import ImmutableSandboxedEnvironment

from contract.model_args import V4, V41
from contract.v41_config import is_v41
from runtime.text.grammar import ANYTHING, Reasoning, StructuredOutputs
from runtime.text.tokenizer import Tokenizer
from server import dsml_markup, v4_encoding, v41_encoding
from server.content_marks import ContentMarks, Segment
from server.dsml_grammar import DsmlGrammar
from server.dsml_markup import Markup
from server.protocol import APIError, ChatCompletionRequest, bad_request

FALLBACK = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
# OpenAI's and the DeepSeek API's efforts -> the V4 format's (None, "high" or "max")
EFFORTS = {"low": "high", "medium": "high", "high": "high", "xhigh": "max", "max": "max"}
# -> the V4.1 format's tiers (low 50, high 75, max 100): OpenAI's medium and xhigh, which
# its encoder does not name, to the tier above them (as V4's mapping rounds up)
V41_EFFORTS = {"low": "low", "medium": "high", "high": "high", "xhigh": "max", "max": "max"}


@dataclass(frozen=True)
class ChatFormat:
    """A DeepSeek chat format: its encoder (encode_segments), its DSML tags, and whether
    a vocabulary holds its control tokens (else the checkpoint's template applies)."""

    name: str
    encoder: ModuleType
    markup: Markup
    has_tokens: Callable[[Callable[[str], int | None]], bool]


# by family; a parser flag names the format it reads
FORMATS = {V4: ChatFormat("V4", v4_encoding, dsml_markup.V4, v4_encoding.is_v4_vocab),
           V41: ChatFormat("V4.1", v41_encoding, dsml_markup.V41, v41_encoding.is_v41_vocab)}


@dataclass(frozen=True)
class ChatOptions:
    """The server's flags for reading chat outputs (vLLM's names), and the model's family
    (contract/model_args: "deepseek_v4" or "deepseek_v41"; None where unknown). ValueError
    for a parser that does not read the family's format."""

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    default_chat_template_kwargs: dict | None = None    # a request's own override them
    family: str | None = None

    def __post_init__(self) -> None:
        for flag, parser in (("--reasoning-parser", self.reasoning_parser),
                             ("--tool-call-parser", self.tool_call_parser)):
            if parser is None:
                continue
            if parser not in FORMATS:
                raise ValueError(f"{flag} {parser!r} is none of {', '.join(FORMATS)}")
            if parser != self.chat_format:
                other = FORMATS[self.chat_format].name
                why = f"this model is DeepSeek {other}" if self.family else \
                    f"the other parser reads DeepSeek {other}'s"
                raise ValueError(f"{flag} {parser} reads DeepSeek {FORMATS[parser].name}'s "
                                 f"chat format, but {why}: use {flag} {self.chat_format}")

    @property
    def chat_format(self) -> str:
        """The format prompts are encoded in and outputs read in: the family's, else
        the parsers' (V4.1 if either names it), else V4's."""
        if self.family is not None:
            return self.family
        return V41 if V41 in (self.reasoning_parser, self.tool_call_parser) else V4


def family_of(spec) -> str:
    """A spec's model family, from its architecture's config."""
    return V41 if is_v41(spec.architecture.CONFIG) else V4


@dataclass(frozen=True)
class ChatPlan:
    prompt_ids: list[int]
    thinking: bool                          # the prompt opened a thinking block
    tool_mode: str                          # "none" | "auto" | "required" | "named"
    tool_name: str | None = None            # the named function
    structured: StructuredOutputs | None = None
    fallback: StructuredOutputs | None = None   # auto: if `structured` does not compile
    # how the output's calls are read (server/chat_output.py): the tools a call may name
    # (None: any, for a plan made without a request), whether more than one call is read,
    # and in auto mode whether DSML calls are read at all (not where the output cannot
    # hold the markup's token: a V4 vocabulary under the client's own constraint)
    tool_names: tuple[str, ...] | None = None
    parallel: bool = True
    read_calls: bool = True


def plan(tokenizer: Tokenizer, req: ChatCompletionRequest, options: ChatOptions,
         limit: int | None = None) -> ChatPlan:
    """The request's prompt and how to read its output; a 400 when the prompt certainly
    holds more than `limit` tokens (found before it is encoded whole)."""
    chat_format = options.chat_format
    mode, name = _tool_mode(req, options)
    structured = _tool_constraint(req, mode, name)
    asked = req.structured()
    if asked is not None and structured is not None:
        raise bad_request("response_format and guided outputs cannot be combined with "
                          "tool_choice required or a named function", "response_format")
    tools = [t.function.model_dump(exclude_none=True) for t in req.tools or []] \
        if mode != "none" else []
    auto = mode == "auto" and asked is None
    fallback = None
    if auto:                                  # free text, and calls held to the tools
        structured, fallback = _auto(tokenizer, req, tools, FORMATS[chat_format].markup)
    structured = structured or asked
    kwargs = template_kwargs(req, options)
    thinking = thinking_of(req, kwargs)
    if structured is not None and not auto and not options.reasoning_parser:
        thinking = False        # the reasoning would be the constrained content's start
    if thinking:
        structured = _after_reasoning(tokenizer, structured, req.thinking_token_budget)
        if fallback is not None:
            fallback = _after_reasoning(tokenizer, fallback, req.thinking_token_budget)
    ids = render(tokenizer, messages_of(req, chat_format), thinking=thinking,
                 effort=effort_of(req, chat_format, kwargs), tools=tools, extra=kwargs,
                 limit=limit, chat_format=chat_format)
    names = (name,) if mode == "named" else tuple(t["name"] for t in tools)
    # under the client's own constraint a V4 vocabulary's output cannot hold the token
    # (its strings are text): "｜DSML｜" there is spelled out, never a call
    read_calls = auto or tokenizer.token_id(v4_encoding.DSML) is None
    return ChatPlan(ids, thinking, mode, name, structured, fallback, names,
                    req.parallel_tool_calls is not False, read_calls)


def _auto(tokenizer: Tokenizer, req: ChatCompletionRequest, tools: list[dict],
          markup: Markup) -> tuple[StructuredOutputs, StructuredOutputs]:
    """Auto mode's grammar (free text, call blocks held to the tools' schemas), and its
    fallback holding the calls to the tools' names only."""
    structured, fallback = (StructuredOutputs(grammar=DsmlGrammar(
        tools, tokenizer.token_id(v4_encoding.DSML),
        parallel=req.parallel_tool_calls is not False, schemas=schemas,
        markup=markup).lark()) for schemas in (True, False))
    return structured, fallback


def _after_reasoning(tokenizer: Tokenizer, structured: StructuredOutputs | None,
                     budget: int | None) -> StructuredOutputs | None:
    """The output of a thinking prompt: free reasoning, then the constraint (vLLM's
    reasoning-aware structured outputs); a reasoning budget alone constrains nothing
    after the reasoning, and neither alone is no constraint at all."""
    if structured is None and budget is None:
        return None
    reasoning = Reasoning(v4_encoding.END_THINK, tokenizer.token_id(v4_encoding.END_THINK),
                          budget)
    return replace(structured or StructuredOutputs(regex=ANYTHING), reasoning=reasoning)


def template_kwargs(req, options: ChatOptions | None = None) -> dict:
    """The chat template arguments of a request: the server's defaults
    (--default-chat-template-kwargs) under the request's own chat_template_kwargs."""
    defaults = options.default_chat_template_kwargs if options is not None else None
    return {**(defaults or {}), **(req.chat_template_kwargs or {})}


def thinking_of(req, kwargs: dict | None = None) -> bool:
    """Thinking as the request asks: the DeepSeek API's `thinking`, else the template
    arguments' `thinking` (or `enable_thinking`; `kwargs`, by default the request's
    chat_template_kwargs); off by default."""
    if req.thinking is not None:
        return req.thinking.type == "enabled"
    kwargs = req.chat_template_kwargs or {} if kwargs is None else kwargs
    value = kwargs.get("thinking", kwargs.get("enable_thinking", False))
    if not isinstance(value, bool):
        raise bad_request("chat_template_kwargs.thinking must be true or false",
                          "chat_template_kwargs")
    return value


def effort_of(req, chat_format: str = V4, kwargs: dict | None = None) -> str | int | None:
    """The request's reasoning effort in the format's terms. V4: reasoning_effort as one
    of its two levels. V4.1: reasoning_effort as one of its tiers, else the template
    arguments' reasoning_effort (`kwargs`; vLLM's way), which may also be a budget from 1
    to 100; None: the format's default."""
    if chat_format == V41:
        return _v41_effort(req, kwargs or {})
    if req.reasoning_effort is None:
        return None
    if req.reasoning_effort not in EFFORTS:
        raise bad_request(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got "
                          f"{req.reasoning_effort[:40]!r}", "reasoning_effort")
    return EFFORTS[req.reasoning_effort]


def _v41_effort(req, kwargs: dict) -> str | int | None:
    if req.reasoning_effort is not None:           # a string, by the request's schema
        return _v41_tier(req.reasoning_effort, "reasoning_effort", budgets=False)
    effort = kwargs.get("reasoning_effort")
    return None if effort is None else \
        _v41_tier(effort, "chat_template_kwargs.reasoning_effort", budgets=True)


def _v41_tier(effort, where: str, budgets: bool) -> str | int:
    """A V4.1 tier (or, with `budgets`, a budget 1..100); a 400 naming `where` else."""
    if isinstance(effort, str) and effort in V41_EFFORTS:
        return V41_EFFORTS[effort]
    if budgets and type(effort) is int and 1 <= effort <= 100:     # a bool is no budget
        return effort
    also = " or an integer from 1 to 100" if budgets else ""
    raise bad_request(f"{where} must be one of {', '.join(V41_EFFORTS)}{also}, got "
                      f"{str(effort)[:40]!r}", where.split(".")[0])


def messages_of(req, chat_format: str = V4) -> list[dict]:
    """The request's messages as the encoders take them. V4.1 joins a content's text
    parts with "\\n\\n", as its encoder joins content blocks, and refuses image parts: the
    server runs the text model (the checkpoint's vision tower is not loaded)."""
    if chat_format != V41:
        return [m.as_dict() for m in req.messages]
    return [_v41_message(m, i) for i, m in enumerate(req.messages)]


def _v41_message(message, i: int) -> dict:
    if not isinstance(message.content, list):
        return message.as_dict()
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            what = "an image part" if "image" in part.type else f"a {part.type[:40]!r} part"
            raise bad_request(f"messages[{i}].content[{j}] is {what}: this server serves "
                              "DeepSeek V4.1 as a text model (its vision tower is not "
                              "loaded), so a message's content takes text parts only",
                              f"messages[{i}].content[{j}]")
    return {**message.as_dict(), "content": "\n\n".join(p.text for p in message.content)}


def render_request(tokenizer: Tokenizer, req, options: ChatOptions,
                   limit: int | None = None) -> list[int]:
    """Token ids of a request's conversation (its messages, tools, thinking, effort and
    template arguments) as a chat request renders it: /tokenize's."""
    tools = [t.function.model_dump(exclude_none=True) for t in req.tools or []]
    kwargs = template_kwargs(req, options)
    chat_format = options.chat_format
    return render(tokenizer, messages_of(req, chat_format), thinking=thinking_of(req, kwargs),
                  effort=effort_of(req, chat_format, kwargs), tools=tools, extra=kwargs,
                  limit=limit, chat_format=chat_format)


def render(tokenizer: Tokenizer, messages: list[dict], *, thinking: bool = False,
           effort: str | int | None = None, tools: list[dict] | None = None,
           extra: dict | None = None, limit: int | None = None,
           chat_format: str = V4) -> list[int]:
    """Token ids of the conversation, ending with the assistant's turn to speak; a 400
    when the rendered prompt certainly holds more than `limit` tokens."""
    fmt = FORMATS[chat_format]
    if fmt.has_tokens(tokenizer.token_id):
        try:
            segments = fmt.encoder.encode_segments(
                messages, thinking=thinking, reasoning_effort=effort,
                tools=[{"type": "function", "function": t} for t in tools or []])
        except (ValueError, RecursionError) as exc:
            raise bad_request(f"the messages do not fit the {fmt.name} chat format: {exc}",
                              "messages") from None
        _check_size(tokenizer, "".join(text for text, _ in segments), limit)
        return tokenizer.encode_segments(segments)
    return _render_template(tokenizer, messages, thinking, tools, extra, limit)


def _check_size(tokenizer: Tokenizer, prompt: str, limit: int | None) -> None:
    if limit is not None and tokenizer.exceeds(prompt, limit):
        raise bad_request(f"the conversation renders to a prompt of more than {limit} "
                          f"tokens, the most this model's context leaves a prompt "
                          f"({len(prompt)} characters)", "messages")


# The strings a template compares rather than prints, left unmarked: where the request's
# schema (server/protocol.py) holds them to a few words. Every other string the client
# sent is marked, at any depth (a "type" inside a tool's schema is printed, not compared).
UNMARKED = {"messages": (("*", "role"), ("*", "tool_calls", "*", "type")),
            "tools": (("*", "type"),), "chat_template_kwargs": ()}


def _render_template(tokenizer: Tokenizer, messages: list[dict], thinking: bool,
                     tools: list[dict] | None, extra: dict | None,
                     limit: int | None) -> list[int]:
    """The prompt of a Jinja chat template, with every client string (messages, tools,
    chat_template_kwargs) content: see _marked."""
    tools = [{"type": "function", "function": t} for t in tools or []] or None
    given = {"messages": messages, "tools": tools, "chat_template_kwargs": extra or {}}
    _check_keys(tokenizer, given)
    fill = partial(_fill, tokenizer, thinking)
    text = fill(given)
    _check_size(tokenizer, text, limit)
    segments = _marked(fill, given, text)
    add_special_tokens = tokenizer.chat_template is None
    if segments is not None:
        return tokenizer.encode_segments(segments, add_special_tokens=add_special_tokens)
    # content cannot be told from markup (the template changed the client's text): the
    # whole text is encoded, so no client string may spell an added token
    for field, value in given.items():
        if any(tokenizer.spells_added_token(s) for s in _strings(value)):
            raise bad_request(f"the {field} spell a control token of this checkpoint, and "
                              "its chat template changes their text, so the server cannot "
                              "keep it from acting as one; leave it out", field)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _check_keys(tokenizer: Tokenizer, given: dict) -> None:
    """A 400 for a dict key that spells a control token: a key cannot be marked (a
    template reads fields by their names), and a template may print it (tojson)."""
    for field, value in given.items():
        if any(tokenizer.spells_added_token(k) for k in _strings(value, values=False)):
            raise bad_request(f"a key in the {field} spells a control token of this "
                              "checkpoint; leave it out", field)


def _strings(value, values: bool = True):
    """Every dict key in a JSON-like value and, with `values`, every other string."""
    if isinstance(value, str):
        if values:
            yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, values)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item, values)


def _marked(fill: Callable[[dict], str], given: dict, text: str) -> list[Segment] | None:
    """`text`, the template's prompt, as segments: rendered again with the client's
    strings (message fields, tool definitions, chat_template_kwargs values) between
    content marks. None when that render is not `text` plus well-paired marks: the
    template trimmed, sliced or compared a marked string, or raised on one."""
    marks = ContentMarks()
    try:
        marked = fill({field: marks.wrap_values(value, UNMARKED[field])
                       for field, value in given.items()})
    except APIError:
        return None
    segments = marks.split(marked)
    if segments is None or "".join(t for t, _ in segments) != text:
        return None
    return segments


def _fill(tokenizer: Tokenizer, thinking: bool, given: dict) -> str:
    """The template rendered over `given` (messages, tools, chat_template_kwargs: the
    template's arguments, the server's own taking precedence)."""
    variables = {**given["chat_template_kwargs"], "thinking": thinking,
                 "enable_thinking": thinking, "messages": given["messages"],
                 "tools": given["tools"], "add_generation_prompt": True,
                 "bos_token": tokenizer.config.get("bos_token") or "",
                 "eos_token": tokenizer.config.get("eos_token") or ""}
    try:
        return _template(tokenizer.chat_template or FALLBACK).render(**variables)
    except Exception as exc:   # a template may raise on purpose (e.g. role order)
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from None


@lru_cache(maxsize=8)
def _template(source: str):
    """A chat template, compiled once."""
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        source)


# -- tools -----------------------------------------------------------------------------


def _tool_mode(req: ChatCompletionRequest, options: ChatOptions) -> tuple[str, str | None]:
    choice, tools = req.tool_choice, req.tools or []
    if choice is None:
        choice = "auto" if tools else "none"
    if not isinstance(choice, str):
        if not any(t.function.name == choice.function.name for t in tools):
            raise bad_request(f"tool_choice names {choice.function.name!r}, which is not in "
                              "tools", "tool_choice")
        return "named", choice.function.name
    if choice == "required" and not tools:
        raise bad_request("tool_choice required needs tools", "tool_choice")
    if choice == "auto" and tools and not (options.enable_auto_tool_choice
                                           and options.tool_call_parser):
        raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and '
                          "--tool-call-parser to be set", "tool_choice")
    return (choice if tools else "none"), None


def _tool_constraint(req: ChatCompletionRequest, mode: str,
                     name: str | None) -> StructuredOutputs | None:
    if mode == "named":
        tool = next(t for t in req.tools if t.function.name == name)
        return StructuredOutputs(json=json.dumps(_parameters(tool)))
    if mode == "required":
        calls = [{"type": "object", "properties": {
                      "name": {"enum": [t.function.name]}, "parameters": _parameters(t)},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for t in req.tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return StructuredOutputs(json=json.dumps(schema))
    return None


def _parameters(tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}
