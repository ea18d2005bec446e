"""Detokenizer: one request's output text, grown incrementally, with stop strings.

Each step decodes only a short window of tokens, not the whole output: the text a token
adds is decode(ids[prefix:]) minus decode(ids[prefix:read]), where `read` is where the
released text ends and `prefix` a few tokens before it (a decoder may merge a token with
its neighbours, so a token is never decoded alone). A window that ends in U+FFFD (an
unfinished UTF-8 sequence) adds nothing until a later token completes it. The work per
step is O(new tokens + window), whatever the output's length.
"""
from __future__ import annotations

from runtime.text.tokenizer import Tokenizer

CONTEXT = 5      # tokens decoded before the new ones, so merges across them come out right


class Detokenizer:
    """Released text never holds the start of a stop string: the last len(longest stop)
    - 1 characters are held back, so a stop match always begins in unreleased text."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, stop
        self.text = ""        # text released so far
        self._full = ""       # all decoded text: released, then held back
        self._committed = ""  # the text of ids[:read], which later tokens cannot change
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = self._read = 0       # token offsets of the decode window

    def add(self, ids: list[int]) -> tuple[str, str | None]:
        """Append tokens; (newly released text, the stop string that ended it or None)."""
        self._ids.extend(ids)
        self._decode()
        hits = [(at, s) for s in self.stop if (at := self._full.find(s, len(self.text))) >= 0]
        if hits:
            at, stop = min(hits)
            return self._release(at), stop
        return self._release(len(self._full) - self._hold), None

    def flush(self) -> str:
        """Release everything held back (the output ended for another reason)."""
        return self._release(len(self._full))

    def _decode(self) -> None:
        """Bring `_full` up to the tokens so far: commit what the tokens after `read` add
        when they end on a whole character; else show all but the unfinished tail."""
        decode = self.tokenizer.decode
        before = decode(self._ids[self._prefix:self._read])
        after = decode(self._ids[self._prefix:])
        if not after.startswith(before):    # not additive here: decode everything once
            self._committed = decode(self._ids[:self._read])
            before, after = self._committed, decode(self._ids)
        added = after[len(before):]
        if added.endswith("\ufffd"):       # an unfinished character: keep the window
            self._full = self._committed + added.rstrip("\ufffd")
            return
        self._committed += added
        self._full = self._committed
        self._read = len(self._ids)
        self._prefix = max(0, self._read - CONTEXT)

    def _release(self, end: int) -> str:
        end = max(end, len(self.text))
        delta, self.text = self._full[len(self.text):end], self._full[:end]
        return delta
