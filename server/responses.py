"""OpenAI response bodies: completions and chat, whole and streamed."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.engine.output_processor import RequestOutput
from runtime.text.growing_text import GrowingText
from runtime.text.tokenizer import Tokenizer
from server.chat_output import ChatOutput


@dataclass
class ChoiceState:
    """What one choice has produced so far; adding an output costs O(its news)."""

    index: int
    prompt_tokens: int
    released: GrowingText = field(default_factory=GrowingText)   # `text`, unjoined
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cached_tokens: int = 0            # of the prompt, found in the prefix cache
    reader: ChatOutput | None = None  # chat: the text read as a message
    delta: dict = field(default_factory=dict)   # chat: what the last output added

    def add(self, out: RequestOutput) -> None:
        if out.num_cached_tokens is not None:
            self.cached_tokens = out.num_cached_tokens
        self.released.append(out.new_text)
        if self.reader is not None:
            self.delta = self.reader.feed(out.new_text, final=out.finished)
        self.token_ids += out.new_ids
        self.logprobs += out.logprobs
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason

    @property
    def text(self) -> str:
        """The choice's text so far (joined: O(length), for the whole response)."""
        return str(self.released)

    def logprobs_delta(self, out: RequestOutput, tokenizer: Tokenizer | None):
        return _completion_logprobs(out.logprobs, tokenizer, 0) if out.logprobs else None

    def chat_logprobs_delta(self, out: RequestOutput, tokenizer: Tokenizer | None):
        return _chat_logprobs(out.logprobs, tokenizer) if out.logprobs else None


LOGPROB_FLOOR = -9999.0   # JSON has no -inf: a log-prob of an impossible token (vLLM's floor)


def _logprob(value: float) -> float:
    return value if value > LOGPROB_FLOOR else LOGPROB_FLOOR    # NaN included


def _token(tokenizer: Tokenizer | None, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer \
        else f"token_id:{token_id}"


def _completion_logprobs(items, tokenizer, offset: int) -> dict:
    tokens = [_token(tokenizer, item.token) for item in items]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [_logprob(item.logprob) for item in items],
        "top_logprobs": [_top(item, tokenizer) for item in items],
        "text_offset": offsets,
    }


def _top(item, tokenizer) -> dict[str, float]:
    """A position's top log-probs as the legacy completions API gives them: the top
    entries and the sampled token (so `logprobs: 0` still shows the sampled one)."""
    top = {_token(tokenizer, t): _logprob(lp) for t, lp in item.top}
    top.setdefault(_token(tokenizer, item.token), _logprob(item.logprob))
    return top


def _chat_logprobs(items, tokenizer) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = _token(tokenizer, token_id)
        return {"token": text, "logprob": _logprob(logprob), "bytes": list(text.encode())}

    return {"content": [{**entry(item.token, item.logprob),
                         "top_logprobs": [entry(t, lp) for t, lp in item.top]}
                        for item in items]}


def usage(states: list[ChoiceState], n: int) -> dict:
    """Prompt tokens count once per prompt; completion tokens over every choice."""
    prompt = sum(s.prompt_tokens for s in states if s.index % n == 0)
    cached = sum(s.cached_tokens for s in states if s.index % n == 0)
    completion = sum(len(s.token_ids) for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def completion_response(meta: dict, states: list[ChoiceState], echo: list[str], n: int,
                        tokenizer: Tokenizer | None) -> dict:
    choices = []
    for s in states:
        prefix = echo[s.index // n]
        logprobs = _completion_logprobs(s.logprobs, tokenizer, len(prefix)) \
            if s.logprobs else None
        choices.append({"index": s.index, "text": prefix + s.text, "logprobs": logprobs,
                        "finish_reason": s.finish_reason, "stop_reason": s.stop_reason})
    return {**meta, "object": "text_completion", "choices": choices, "usage": usage(states, n)}


def completion_chunk(meta: dict, index: int, text: str, logprobs, finish_reason,
                     stop_reason) -> dict:
    return {**meta, "object": "text_completion", "choices": [{
        "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
        "stop_reason": stop_reason}]}


def chat_response(meta: dict, states: list[ChoiceState], n: int,
                  tokenizer: Tokenizer | None) -> dict:
    choices = [{"index": s.index, "message": s.reader.message() if s.reader else
                {"role": "assistant", "content": s.text},
                "logprobs": _chat_logprobs(s.logprobs, tokenizer) if s.logprobs else None,
                "finish_reason": s.reader.finish_reason(s.finish_reason) if s.reader
                else s.finish_reason, "stop_reason": s.stop_reason}
               for s in states]
    return {**meta, "object": "chat.completion", "choices": choices, "usage": usage(states, n)}


def chat_chunk(meta: dict, index: int, delta: dict, logprobs, finish_reason,
               stop_reason) -> dict:
    return {**meta, "object": "chat.completion.chunk", "choices": [{
        "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
        "stop_reason": stop_reason}]}
