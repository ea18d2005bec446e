"""Detokenizer: one request's output text, grown incrementally, with stop strings.

The text is what `tokenizer.decode` of the ids gives, built in work O(new tokens + new
text + held-back text) a step, whatever the bytes and however long the output: neither
the text released so far nor the ids are copied or searched again.

A byte-level vocabulary (Tokenizer.token_bytes: `decode` joins the tokens' bytes and
reads them as UTF-8 with errors="replace") is decoded byte by byte: the new tokens'
bytes go through an incremental UTF-8 decoder, which holds back only the 1-3 bytes of a
character not yet finished, and turns each maximal byte sequence that no later byte can
make valid (0xFF, a lone continuation byte, a lead byte followed by a byte that cannot
continue it) into one U+FFFD at once. That is the full decode's rule, so the streamed
text equals the full decode at every split; flush() ends the stream, and an unfinished
character left at the end becomes its U+FFFD, as in the full decode.

Any other vocabulary is decoded in short windows of tokens: the text a token adds is
decode(ids[prefix:]) minus decode(ids[prefix:read]), where `read` is where the committed
text ends and `prefix` a few tokens before it (a decoder may merge a token with its
neighbours, so a token is never decoded alone). A window whose text ends in U+FFFD (an
unfinished character, if its decoder has bytes) is held at most HELD tokens past `read`,
then committed as it decodes, so the window stays bounded whatever the tokens are (a
character whose bytes span more tokens than that comes out as its U+FFFD). Where a
decoder is not additive over a window (its text for more tokens does not begin with its
text for fewer), the ids are decoded whole once, as they always were on this path.
"""
from __future__ import annotations

import codecs

from runtime.text.growing_text import GrowingText
from runtime.text.tokenizer import Tokenizer

CONTEXT = 5      # tokens decoded before the new ones, so merges across them come out right
HELD = 4         # tokens a window ending in U+FFFD waits for (a character's bytes: <= 4)


class Detokenizer:
    """Released text never holds the start of a stop string: the last len(longest stop)
    - 1 characters are held back, so a stop match always begins in unreleased text.

    The decoded text, by character offset:

        |<------ released ------>|<-- pending -->|
        |<--- committed --->|                          (committed may end either side
                                                        of the released end)

    `released` only grows (a GrowingText: outputs take O(1) snapshots of it); `pending`,
    the decoded text past it, is all a step copies or searches: the held-back characters
    plus what the step decoded. `committed` is the text later tokens cannot change: with
    a byte-level vocabulary all the decoded text (the unfinished character's bytes wait
    in the UTF-8 decoder), else the text of ids[:read], the window's past it redone each
    step."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, stop
        self.released = GrowingText()     # text released so far
        self._pending = ""                # decoded text past the released
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._bytes = tokenizer.token_bytes          # None: decoded in windows
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._committed = 0               # windows: characters of the text of ids[:read]
        self._ids: list[int] = []         # windows only: the ids so far
        self._prefix = self._read = 0       # token offsets of the decode window

    @property
    def text(self) -> str:
        """Every character released so far (joined: O(length), for reading, not a step)."""
        return str(self.released)

    def add(self, ids: list[int]) -> tuple[str, str | None]:
        """Append tokens; (newly released text, the stop string that ended it or None)."""
        self._decode(ids)
        hits = [(at, s) for s in self.stop if (at := self._pending.find(s)) >= 0]
        if hits:
            at, stop = min(hits)
            return self._release(at), stop
        return self._release(len(self._pending) - self._hold), None

    def flush(self) -> str:
        """Release everything held back (the output ended for another reason), an
        unfinished character at the end as U+FFFD."""
        self._decode([], final=True)
        return self._release(len(self._pending))

    def _decode(self, ids: list[int], final: bool = False) -> None:
        if self._bytes is None:
            self._ids.extend(ids)
            self._decode_window(final)
            return
        table, size = self._bytes, len(self._bytes)
        raw = b"".join([table[i] for i in ids if 0 <= i < size])
        self._pending += self._utf8.decode(raw, final)
        held, _ = self._utf8.getstate()
        if held[:1] == b"\xed" and held[1:2] >= b"\xa0":
            # a surrogate's first bytes, never valid: Python's codec waits for a third
            # byte to replace them, the whole decode replaces each of them now
            self._pending += "\ufffd\ufffd"
            self._utf8.reset()

    def _decode_window(self, final: bool) -> None:
        """Bring the decoded text up to the tokens so far: commit what the tokens after
        `read` add when they end on a whole character (or have waited HELD tokens, or
        the output ends); else show all but the unfinished tail."""
        decode = self.tokenizer.decode
        before = decode(self._ids[self._prefix:self._read])
        after = decode(self._ids[self._prefix:])
        if not after.startswith(before):    # not additive here: decode everything once
            before, after = decode(self._ids[:self._read]), decode(self._ids)
            self._committed, self._pending = len(before), before[len(self.released):]
        added = after[len(before):]
        waiting = len(self._ids) - self._read <= HELD and not final
        if added.endswith("\ufffd") and waiting:    # an unfinished character: keep it
            self._show(added.rstrip("\ufffd"))
            return
        self._show(added)
        self._committed += len(added)
        self._read = len(self._ids)
        self._prefix = max(0, self._read - CONTEXT)

    def _show(self, shown: str) -> None:
        """Windows: the decoded text is the committed text, then `shown`: pending
        follows."""
        unreleased = self._committed - len(self.released)   # < 0: released past commit
        self._pending = self._pending[:max(unreleased, 0)] + shown[max(-unreleased, 0):]

    def _release(self, end: int) -> str:
        """Release the first `end` pending characters (none if end <= 0)."""
        delta, self._pending = self._pending[:max(end, 0)], self._pending[max(end, 0):]
        self.released.append(delta)
        return delta
