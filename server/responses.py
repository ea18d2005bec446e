"""OpenAI response bodies: completions and chat, whole and streamed.

A choice takes each output as it arrives (ChoiceState.add: O(its news), log-probs
encoded then, server/logprobs.py); a whole response is then written as JSON from those
pieces by `completion_response` / `chat_response`, which the server runs on a
preparation thread (the body of 64 long choices is megabytes)."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.engine.output_processor import RequestOutput
from runtime.text.growing_text import GrowingText
from server.chat_output import ChatOutput
from server.logprobs import ChatLogprobs, CompletionLogprobs, TokenText, dumps


@dataclass
class ChoiceState:
    """What one choice has produced so far; adding an output costs O(its news)."""

    index: int
    prompt_tokens: int
    released: GrowingText = field(default_factory=GrowingText)   # `text`, unjoined
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cached_tokens: int = 0            # of the prompt, found in the prefix cache
    reader: ChatOutput | None = None  # chat: the text read as a message
    delta: dict = field(default_factory=dict)   # chat: what the last output added
    # a whole response's log-probs, encoded as they come (None: not shown, or a stream's,
    # which go out with each chunk)
    logprobs: CompletionLogprobs | ChatLogprobs | None = None
    cumulative_logprob: float = 0.0   # of the sampled tokens (best_of ranks by it)

    def add(self, out: RequestOutput) -> None:
        if out.num_cached_tokens is not None:
            self.cached_tokens = out.num_cached_tokens
        self.released.append(out.new_text)
        if self.reader is not None:
            self.delta = self.reader.feed(out.new_text, final=out.finished)
        self.token_ids += out.new_ids
        if out.logprobs:
            self.cumulative_logprob += sum(item.logprob for item in out.logprobs)
            if self.logprobs is not None:
                self.logprobs.add(out.logprobs)
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason

    @property
    def text(self) -> str:
        """The choice's text so far (joined: O(length), for the whole response)."""
        return str(self.released)

    @staticmethod
    def logprobs_delta(out: RequestOutput, text: TokenText):
        """A streamed completion chunk's `logprobs` (None without)."""
        return text.completion(out.logprobs) if out.logprobs else None

    @staticmethod
    def chat_logprobs_delta(out: RequestOutput, text: TokenText):
        """A streamed chat chunk's `logprobs` (None without)."""
        return text.chat(out.logprobs) if out.logprobs else None


def usage(states: list[ChoiceState], n: int) -> dict:
    """Prompt tokens count once per prompt; completion tokens over every choice."""
    prompt = sum(s.prompt_tokens for s in states if s.index % n == 0)
    cached = sum(s.cached_tokens for s in states if s.index % n == 0)
    completion = sum(len(s.token_ids) for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _body(meta: dict, kind: str, choices: list[str], usage_: dict) -> bytes:
    """A response object as JSON bytes, its choices given as JSON."""
    head = dumps({**meta, "object": kind})[:-1]
    return f'{head},"choices":[{",".join(choices)}],"usage":{dumps(usage_)}}}'.encode()


def _logprobs_json(s: ChoiceState, offset: int = 0) -> str:
    return s.logprobs.json(offset) if s.logprobs else "null"


def completion_response(meta: dict, states: list[ChoiceState], echo: list[str],
                        n: int) -> bytes:
    """The whole completion response as JSON (O(its size): call it off the loop)."""
    choices = []
    for s in states:
        prefix = echo[s.index // n]
        choices.append(f'{{"index":{s.index},"text":{dumps(prefix + s.text)},'
                       f'"logprobs":{_logprobs_json(s, len(prefix))},'
                       f'"finish_reason":{dumps(s.finish_reason)},'
                       f'"stop_reason":{dumps(s.stop_reason)}}}')
    return _body(meta, "text_completion", choices, usage(states, n))


def completion_chunk(meta: dict, index: int, text: str, logprobs, finish_reason,
                     stop_reason) -> dict:
    return {**meta, "object": "text_completion", "choices": [{
        "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
        "stop_reason": stop_reason}]}


def chat_response(meta: dict, states: list[ChoiceState], n: int) -> bytes:
    """The whole chat response as JSON (O(its size): call it off the loop)."""
    choices = []
    for s in states:
        message = s.reader.message() if s.reader else {"role": "assistant", "content": s.text}
        finish = s.reader.finish_reason(s.finish_reason) if s.reader else s.finish_reason
        choices.append(f'{{"index":{s.index},"message":{dumps(message)},'
                       f'"logprobs":{_logprobs_json(s)},"finish_reason":{dumps(finish)},'
                       f'"stop_reason":{dumps(s.stop_reason)}}}')
    return _body(meta, "chat.completion", choices, usage(states, n))


def chat_chunk(meta: dict, index: int, delta: dict, logprobs, finish_reason,
               stop_reason) -> dict:
    return {**meta, "object": "chat.completion.chunk", "choices": [{
        "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
        "stop_reason": stop_reason}]}
