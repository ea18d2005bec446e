"""Detokenizer: one request's output text, grown incrementally, with stop strings.

Each step decodes only a short window of tokens, not the whole output: the text a token
adds is decode(ids[prefix:]) minus decode(ids[prefix:read]), where `read` is where the
committed text ends and `prefix` a few tokens before it (a decoder may merge a token with
its neighbours, so a token is never decoded alone). A window that ends in U+FFFD (an
unfinished UTF-8 sequence) adds nothing until a later token completes it. The work per
step is O(new tokens + window + held-back text), whatever the output's length: neither the
text released so far nor the ids are copied or searched again.
"""
from __future__ import annotations

from runtime.text.growing_text import GrowingText
from runtime.text.tokenizer import Tokenizer

CONTEXT = 5      # tokens decoded before the new ones, so merges across them come out right


class Detokenizer:
    """Released text never holds the start of a stop string: the last len(longest stop)
    - 1 characters are held back, so a stop match always begins in unreleased text.

    The decoded text, by character offset:

        |<------ released ------>|<-- pending -->|
        |<--- committed --->|                          (committed may end either side
                                                        of the released end)

    `released` only grows (a GrowingText: outputs take O(1) snapshots of it); `pending`,
    the decoded text past it, is all a step copies or searches: the held-back characters
    plus what the step decoded. `committed` is the text of ids[:read], which later tokens
    cannot change; the decoded text past it is the window's, redone each step."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, stop
        self.released = GrowingText()     # text released so far
        self._pending = ""                # decoded text past the released
        self._committed = 0               # characters of the text of ids[:read]
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = self._read = 0       # token offsets of the decode window

    @property
    def text(self) -> str:
        """Every character released so far (joined: O(length), for reading, not a step)."""
        return str(self.released)

    def add(self, ids: list[int]) -> tuple[str, str | None]:
        """Append tokens; (newly released text, the stop string that ended it or None)."""
        self._ids.extend(ids)
        self._decode()
        hits = [(at, s) for s in self.stop if (at := self._pending.find(s)) >= 0]
        if hits:
            at, stop = min(hits)
            return self._release(at), stop
        return self._release(len(self._pending) - self._hold), None

    def flush(self) -> str:
        """Release everything held back (the output ended for another reason)."""
        return self._release(len(self._pending))

    def _decode(self) -> None:
        """Bring the decoded text up to the tokens so far: commit what the tokens after
        `read` add when they end on a whole character; else show all but the unfinished
        tail."""
        decode = self.tokenizer.decode
        before = decode(self._ids[self._prefix:self._read])
        after = decode(self._ids[self._prefix:])
        if not after.startswith(before):    # not additive here: decode everything once
            before, after = decode(self._ids[:self._read]), decode(self._ids)
            self._committed, self._pending = len(before), before[len(self.released):]
        added = after[len(before):]
        if added.endswith("\ufffd"):       # an unfinished character: keep the window
            self._show(added.rstrip("\ufffd"))
            return
        self._show(added)
        self._committed += len(added)
        self._read = len(self._ids)
        self._prefix = max(0, self._read - CONTEXT)

    def _show(self, shown: str) -> None:
        """The decoded text is now the committed text, then `shown`: pending follows."""
        unreleased = self._committed - len(self.released)   # < 0: released past commit
        self._pending = self._pending[:max(unreleased, 0)] + shown[max(-unreleased, 0):]

    def _release(self, end: int) -> str:
        """Release the first `end` pending characters (none if end <= 0)."""
        delta, self._pending = self._pending[:max(end, 0)], self._pending[max(end, 0):]
        self.released.append(delta)
        return delta
