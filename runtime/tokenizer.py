"""The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json)."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self.path = directory / "tokenizer.json"
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

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (added tokens included), else None."""
        return self._tok.token_to_id(token)

    def token_text(self, token_id: int) -> str:
        return self._tok.id_to_token(token_id) or ""
