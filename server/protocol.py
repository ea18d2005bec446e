"""OpenAI request bodies, their validation, and OpenAI-shaped errors.

Unknown fields are ignored (as vLLM does); a field of the wrong type or out of range is
a 400 whose `param` names it. Types are checked here (every float finite); the domain of
each sampling value is checked once, by SamplingParams, and reported under the name the
endpoint gave the field.
"""
from __future__ import annotations

import json
import re
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.text.grammar import GrammarError, StructuredOutputs


class APIError(Exception):
    """An error the client caused (or a server state it must see): status and body."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "BadRequestError", param)


_STRICT = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class JsonSchema(BaseModel):
    model_config = _STRICT
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StructuredOutputsBody(BaseModel):
    """vLLM's `structured_outputs` field: exactly one of these."""

    model_config = _STRICT
    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _Sampling(BaseModel):
    """Fields shared by completions and chat completions (vLLM's extensions included)."""

    model_config = _STRICT
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    cache_salt: str | None = None   # vLLM's: prefix-cache entries shared within a salt only
    stream: bool = False
    stream_options: StreamOptions | None = None
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and guided_*
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def structured(self) -> StructuredOutputs | None:
        """The output constraint the request asks for (None: none); a 400 naming the
        field if it asks for more than one or one that is malformed."""
        given = [(name, value) for name, value in self._constraints() if value is not None]
        if len(given) > 1:
            raise bad_request("give at most one of response_format (json), "
                              "structured_outputs and guided_*: got "
                              + ", ".join(name for name, _ in given), given[1][0])
        if not given:
            return None
        name, fields = given[0]
        try:
            return StructuredOutputs(**fields)
        except GrammarError as exc:
            raise bad_request(str(exc), name) from None

    def structured_source(self) -> str | None:
        """The field the request's constraint came in (None: it has none)."""
        return next((name for name, value in self._constraints() if value is not None), None)

    def _constraints(self):
        """(field, StructuredOutputs fields or None) for every way to ask for one."""
        rf = self.response_format
        if rf is None or rf.type == "text":
            yield "response_format", None
        elif rf.type == "json_object":
            yield "response_format", {"json_object": True}
        else:
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise bad_request("response_format json_schema needs json_schema.schema",
                                  "response_format")
            yield "response_format", {"json": json.dumps(rf.json_schema.schema_)}
        so = self.structured_outputs
        if so is not None:
            fields = {"json": _json_text(so.json_), "regex": so.regex, "grammar": so.grammar,
                      "choice": tuple(so.choice) if so.choice is not None else None,
                      "json_object": bool(so.json_object)}
            yield "structured_outputs", {k: v for k, v in fields.items() if v}
        yield "guided_json", None if self.guided_json is None else \
            {"json": _json_text(self.guided_json)}
        yield "guided_regex", None if self.guided_regex is None else {"regex": self.guided_regex}
        yield "guided_choice", None if self.guided_choice is None else \
            {"choice": tuple(self.guided_choice)}
        yield "guided_grammar", None if self.guided_grammar is None else \
            {"grammar": self.guided_grammar}

    def sampling(self, max_tokens: int, logprobs: int | None,
                 structured: StructuredOutputs | None = None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        values = {
            "max_tokens": max_tokens, "temperature": _default(self.temperature, 1.0),
            "top_p": _default(self.top_p, 1.0), "top_k": _default(self.top_k, 0),
            "min_p": _default(self.min_p, 0.0), "seed": self.seed,
            "presence_penalty": _default(self.presence_penalty, 0.0),
            "frequency_penalty": _default(self.frequency_penalty, 0.0),
            "repetition_penalty": _default(self.repetition_penalty, 1.0),
            "stop": stop, "stop_token_ids": tuple(self.stop_token_ids or ()),
            "ignore_eos": self.ignore_eos, "logprobs": logprobs,
            "logit_bias": _logit_bias(self.logit_bias), "structured": structured,
            "cache_salt": self.cache_salt,
        }
        try:
            return SamplingParams(**values)
        except InvalidParam as exc:
            raise self.invalid(exc) from None

    def invalid(self, exc: InvalidParam) -> APIError:
        """The 400 for a value SamplingParams or the engine refused, under this
        endpoint's name for the field."""
        return bad_request(str(exc), self.param_name(exc.param))

    def param_name(self, field: str) -> str:
        """This endpoint's name for a SamplingParams field."""
        return field

    def check_common(self, max_n: int) -> None:
        if not 1 <= self.n <= max_n:
            raise bad_request(f"n must be in [1, {max_n}], got {self.n}", "n")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true",
                              "stream_options")


def _json_text(value: str | dict | None) -> str | None:
    """A schema given as JSON text or as an object, as JSON text."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def _default(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


# a token id as canonical decimal: one spelling per id ("5", never "05" or "+5"), so two
# keys of one object never name the same token (their biases would add up)
_TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,18}")


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as sorted (id, bias) pairs."""
    pairs = []
    for key, value in (bias or {}).items():
        if not _TOKEN_ID.fullmatch(key):
            raise bad_request(f"logit_bias keys must be token ids in decimal without sign, "
                              f"spaces or leading zeros, got {key[:40]!r}", "logit_bias")
        pairs.append((int(key), value))
    return tuple(sorted(pairs))


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    best_of: int | None = None
    echo: bool = False

    def check_best_of(self, max_n: int) -> int:
        """How many candidates to generate per prompt (the n best are returned)."""
        if self.best_of is None:
            return self.n
        if not self.n <= self.best_of <= max_n:
            raise bad_request(f"best_of must be in [n, {max_n}] (n is {self.n}), got "
                              f"{self.best_of}", "best_of")
        if self.stream and self.best_of > self.n:
            raise bad_request("best_of greater than n cannot be streamed", "best_of")
        return self.best_of

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of text or token-id prompts."""
        p = self.prompt
        if p is None or p == "" or p == []:
            raise bad_request("prompt must be a non-empty string, list of strings, list of "
                              "token ids, or list of token-id lists", "prompt")
        if isinstance(p, str) or (isinstance(p, list) and isinstance(p[0], int)):
            return [p]
        if any(x == "" or x == [] for x in p):
            raise bad_request("every prompt in the list must be non-empty", "prompt")
        return list(p)


class ContentPart(BaseModel):
    model_config = _STRICT
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    model_config = _STRICT
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning_content: str | None = None          # an earlier assistant turn's thinking
    tool_calls: list[ToolCall] | None = None      # an earlier assistant turn's calls
    tool_call_id: str | None = None               # a tool result: the call it answers

    def as_dict(self) -> dict:
        """The message as the chat encoders take it (content flattened to text)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def text(self) -> str:
        if isinstance(self.content, list):
            if any(p.type != "text" or p.text is None for p in self.content):
                raise bad_request("only text content parts are supported", "messages")
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)   # kept as given
    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: NamedFunction


class Thinking(BaseModel):
    """The DeepSeek API's switch: {"type": "enabled"} or {"type": "disabled"}."""

    model_config = _STRICT
    type: Literal["enabled", "disabled"]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking: Thinking | None = None
    reasoning_effort: str | None = None
    # reasoning tokens at most (a grammar's token limit: a 32-bit count is plenty)
    thinking_token_budget: int | None = Field(default=None, ge=0, le=2**31 - 1)

    def param_name(self, field: str) -> str:
        if field == "logprobs":
            return "top_logprobs"
        if field == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return field

    def check(self) -> None:
        if not self.messages:
            raise bad_request("messages must hold at least one message", "messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")


class TokenizeRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking: Thinking | None = None
    reasoning_effort: str | None = None


class DetokenizeRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    tokens: list[int]


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body; a 400 naming the bad field as `messages[2].content`."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        # of a union's failed members, the deepest is the one the client meant
        err = max(exc.errors(), key=lambda e: len(e["loc"]))
        param = field_path(err["loc"]) or None
        raise bad_request(f"{param}: {err['msg']}" if param else err["msg"], param) from None


def field_path(loc: tuple) -> str:
    """pydantic's error location as the client wrote the field: `messages[0].role`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _is_type_tag(part):
            path += f".{part}" if path else part
    return path


def _is_type_tag(part: str) -> bool:
    """A union member's name in a location ('str', 'list[int]', 'ContentPart')."""
    return part in _TYPE_NAMES or "[" in part or part[:1].isupper()


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}
