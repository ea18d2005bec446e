"""The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json) and incremental
detokenization with stop strings."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self._tok = _HFTokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.bos_id = self._special_id("bos_token")
        self.eos_id = self._special_id("eos_token")
        self.chat_template: str | None = self.config.get("chat_template")

    def _special_id(self, key: str) -> int | None:
        token = self.config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        return self._tok.token_to_id(token) if token else None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tok.id_to_token(token_id) or ""


class Detokenizer:
    """Text of one request's output, grown token by token.

    The whole output is decoded again each time (decoders may merge across tokens). A
    trailing U+FFFD (an unfinished UTF-8 sequence) is held back until it resolves, and so
    are the last len(longest stop string) - 1 characters, so that released text never
    holds the start of a stop string: a stop match always begins in unreleased text.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, stop
        self.text = ""        # text released so far
        self._full = ""       # all decoded text
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []

    def add(self, ids: list[int]) -> tuple[str, str | None]:
        """Append tokens; (newly released text, the stop string that ended it or None)."""
        self._ids.extend(ids)
        full = self.tokenizer.decode(self._ids)
        while full.endswith("\ufffd"):
            full = full[:-1]
        if full.startswith(self.text):
            self._full = full
        hits = [(at, s) for s in self.stop if (at := self._full.find(s, len(self.text))) >= 0]
        if hits:
            at, stop = min(hits)
            return self._release(at), stop
        return self._release(len(self._full) - self._hold), None

    def flush(self) -> str:
        """Release everything held back (the output ended for another reason)."""
        return self._release(len(self._full))

    def _release(self, end: int) -> str:
        end = max(end, len(self.text))
        delta, self.text = self._full[len(self.text):end], self._full[:end]
        return delta
