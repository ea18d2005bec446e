"""OpenAI request bodies, their validation, and OpenAI-shaped errors.

Unknown fields are ignored (as vLLM does); a field of the wrong type or out of range is
a 400 whose `param` names it.
"""
from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from runtime.sampling_params import SamplingParams


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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields shared by completions and chat completions (vLLM's extensions included)."""

    model_config = ConfigDict(extra="ignore")
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
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        values = {
            "max_tokens": max_tokens, "temperature": _default(self.temperature, 1.0),
            "top_p": _default(self.top_p, 1.0), "top_k": max(0, _default(self.top_k, 0)),
            "min_p": _default(self.min_p, 0.0), "seed": self.seed,
            "presence_penalty": _default(self.presence_penalty, 0.0),
            "frequency_penalty": _default(self.frequency_penalty, 0.0),
            "repetition_penalty": _default(self.repetition_penalty, 1.0),
            "stop": stop, "stop_token_ids": tuple(self.stop_token_ids or ()),
            "ignore_eos": self.ignore_eos, "logprobs": logprobs,
        }
        try:
            return SamplingParams(**values)
        except ValueError as exc:
            raise bad_request(str(exc)) from None

    def check_common(self) -> None:
        if self.n < 1:
            raise bad_request(f"n must be at least 1, got {self.n}", "n")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true",
                              "stream_options")


def _default(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False

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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            parts = [p.get("text", "") for p in self.content if p.get("type") == "text"]
            if len(parts) != len(self.content):
                raise bad_request("only text content parts are supported", "messages")
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def check(self) -> None:
        if not self.messages:
            raise bad_request("messages must hold at least one message", "messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body; a 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        fields = [str(p) for p in err["loc"] if not isinstance(p, int)]
        # the field the client sent; a union's member names would only confuse it
        param = ".".join(f for f in fields if f.isidentifier() and f not in _TYPE_NAMES) or None
        raise bad_request(f"{param}: {err['msg']}" if param else err["msg"], param) from None


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}
