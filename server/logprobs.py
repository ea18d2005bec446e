"""Log-probs as the OpenAI API shows them, built where each token arrives.

    TokenText          each id's text (the token decoded alone, special tokens shown)
                       and its bytes, made once per id for the server's lifetime
    CompletionLogprobs a whole completion choice's `logprobs`, grown an output at a time
    ChatLogprobs       a whole chat choice's `logprobs.content`, the same way

A top-20 request shows 21 strings per generated token. Each is a dict lookup here
(TokenText), and a whole response's log-probs are encoded to JSON per output as it
arrives (O(its tokens x top) on the event loop, a bounded amount per token), so the end
of a request joins finished JSON pieces on a preparation thread instead of decoding and
encoding 2M strings on the event loop (64 choices x 1,500 tokens x 21).
"""
from __future__ import annotations

import json
from functools import partial

from runtime.device.step_result import TokenLogprobs
from runtime.text.tokenizer import Tokenizer

LOGPROB_FLOOR = -9999.0   # JSON has no -inf: a log-prob of an impossible token (vLLM's floor)

# a response body's JSON, written as Starlette's JSONResponse writes it
dumps = partial(json.dumps, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def logprob(value: float) -> float:
    return value if value > LOGPROB_FLOOR else LOGPROB_FLOOR    # NaN included


class TokenText:
    """Each token id's text and bytes as log-probs show them, decoded once per id (at
    most the vocabulary's size of entries). Read by the event loop and the preparation
    threads: a race fills an entry twice with the same value."""

    def __init__(self, tokenizer: Tokenizer | None):
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = \
                self.tokenizer.decode([token_id], skip_special_tokens=False) \
                if self.tokenizer is not None else f"token_id:{token_id}"
        return text

    def bytes(self, token_id: int) -> list[int]:
        """The UTF-8 bytes of the id's text, as a list (shared: do not change it)."""
        held = self._bytes.get(token_id)
        if held is None:
            held = self._bytes[token_id] = list(self.text(token_id).encode())
        return held

    # -- one output's news: a streamed chunk's `logprobs` ----------------------------

    def completion(self, items: list[TokenLogprobs], offset: int = 0) -> dict:
        """The legacy completions `logprobs` of these tokens, text offsets from
        `offset`."""
        tokens = [self.text(item.token) for item in items]
        offsets, at = [], offset
        for text in tokens:
            offsets.append(at)
            at += len(text)
        return {"tokens": tokens, "token_logprobs": [logprob(item.logprob) for item in items],
                "top_logprobs": [self.top(item) for item in items], "text_offset": offsets}

    def top(self, item: TokenLogprobs) -> dict[str, float]:
        """A position's top log-probs as the legacy completions API gives them: the top
        entries and the sampled token (so `logprobs: 0` still shows the sampled one)."""
        top = {self.text(t): logprob(lp) for t, lp in item.top}
        top.setdefault(self.text(item.token), logprob(item.logprob))
        return top

    def chat(self, items: list[TokenLogprobs]) -> dict:
        """A chat chunk's `logprobs` of these tokens."""
        return {"content": [self.chat_entry(item) for item in items]}

    def chat_entry(self, item: TokenLogprobs) -> dict:
        return {**self._entry(item.token, item.logprob),
                "top_logprobs": [self._entry(t, lp) for t, lp in item.top]}

    def _entry(self, token_id: int, value: float) -> dict:
        return {"token": self.text(token_id), "logprob": logprob(value),
                "bytes": self.bytes(token_id)}


class CompletionLogprobs:
    """A completion choice's `logprobs`, each output's tokens encoded as it arrives."""

    def __init__(self, text: TokenText):
        self.text = text
        self.tokens: list[str] = []           # each token's text, as JSON
        self.values: list[float] = []         # each token's log-prob, floored
        self.tops: list[str] = []             # each position's top log-probs, as JSON
        self.lengths: list[int] = []          # each token's text's length (the offsets)

    def add(self, items: list[TokenLogprobs]) -> None:
        for item in items:
            token = self.text.text(item.token)
            self.tokens.append(dumps(token))
            self.values.append(logprob(item.logprob))
            self.tops.append(dumps(self.text.top(item)))
            self.lengths.append(len(token))

    def __bool__(self) -> bool:
        return bool(self.tokens)

    def json(self, offset: int) -> str:
        """The `logprobs` object as JSON, text offsets from `offset` (the echoed
        prompt's length): O(its tokens), joining pieces made before."""
        offsets, at = [], offset
        for length in self.lengths:
            offsets.append(at)
            at += length
        return (f'{{"tokens":[{",".join(self.tokens)}],"token_logprobs":{dumps(self.values)},'
                f'"top_logprobs":[{",".join(self.tops)}],"text_offset":{dumps(offsets)}}}')


class ChatLogprobs:
    """A chat choice's `logprobs`, each output's tokens encoded as it arrives."""

    def __init__(self, text: TokenText):
        self.text = text
        self.entries: list[str] = []          # each position's entry, as JSON

    def add(self, items: list[TokenLogprobs]) -> None:
        self.entries += [dumps(self.text.chat_entry(item)) for item in items]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def json(self, offset: int = 0) -> str:
        return f'{{"content":[{",".join(self.entries)}]}}'
