"""The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json)."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path

from tokenizers import Encoding
from tokenizers import Tokenizer as _HFTokenizer

PREFIX_SLACK = 16      # tokens a prefix cut at a space may hold beyond the whole text's


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

    def spells_added_token(self, text: str) -> bool:
        """Whether `text` holds the text of an added (control) token."""
        return self._added_pattern.search(text) is not None

    def exceeds(self, text: str, tokens: int) -> bool:
        """Whether `text` certainly encodes to more than `tokens` tokens, found without
        encoding more of it than that takes: by its size where the vocabulary bounds
        the bytes a token stands for (max_token_bytes), else by encoding prefixes that
        grow fourfold, each cut at a space (its tokens are the whole text's over it, but
        for the edges: PREFIX_SLACK). So an overlong prompt costs O(tokens) to refuse."""
        per_token = self.max_token_bytes
        if per_token and len(text.encode("utf-8", "surrogatepass")) > tokens * per_token:
            return True
        length = 8 * (tokens + PREFIX_SLACK)
        while length < len(text):
            cut = text.rfind(" ", length // 2, length)
            prefix = text[: cut if cut > 0 else length]
            if len(self.encode(prefix, add_special_tokens=False)) > tokens + PREFIX_SLACK:
                return True
            length *= 4
        return False

    @cached_property
    def max_token_bytes(self) -> int | None:
        """A bound on the UTF-8 bytes of text one token stands for, so that a text of B
        bytes has at least B / max_token_bytes tokens: for a byte-level vocabulary (a
        ByteLevel decoder, no normalizer), where every byte of the text is in exactly
        one token, each token's own text plus a byte; None for others (a normalizer may
        shrink text, an unknown token may stand for any run of it). Computed once, on
        first use (a pass over the vocabulary)."""
        spec = json.loads(self._tok.to_str())
        normalizer, decoder = spec.get("normalizer"), spec.get("decoder") or {}
        decoders = decoder.get("decoders") or [decoder]
        if normalizer not in (None, {"type": "Sequence", "normalizers": []}) \
                or not any(d.get("type") == "ByteLevel" for d in decoders):
            return None
        return 1 + max(len(self._tok.decode([i], skip_special_tokens=False).encode())
                       for i in range(self.vocab_size))

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...] | None:
        """The bytes each id stands for in decoded text, where `decode` of any ids is
        these bytes joined and read as UTF-8 with errors="replace" (each maximal invalid
        subsequence one U+FFFD, as Rust's from_utf8_lossy and Python's codec both do): a
        vocabulary whose decoder is ByteLevel alone (it maps each token's characters to
        bytes, joins them, and decodes once). Special tokens (skipped by `decode`) and
        ids past the vocabulary stand for no bytes: b"" (an id past the table is read as
        such too). None for other decoders (a word-level one joins with spaces, a byte
        fallback one decodes each run of byte tokens alone), and where one token's bytes
        fail to give that token's `decode`. Built once, on first use (a batch decode of
        every id)."""
        spec = json.loads(self._tok.to_str())
        decoder = spec.get("decoder") or {}
        decoders = decoder.get("decoders") if decoder.get("type") == "Sequence" else [decoder]
        if not decoders or any(d.get("type") != "ByteLevel" for d in decoders):
            return None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        tokens = {i: token for token, i in vocab.items()}
        texts = self._tok.decode_batch([[i] for i in range(self.vocab_size)])
        table = []
        for i, text in enumerate(texts):
            # a token's text without U+FFFD is its bytes decoded; else map its characters
            raw = text.encode() if "\ufffd" not in text else _byte_level(tokens.get(i, ""))
            if raw.decode("utf-8", "replace") != text:
                return None
            table.append(raw)
        return tuple(table)

    def encode_segments(self, segments: Iterable[tuple[str, bool]],
                        add_special_tokens: bool = False) -> list[int]:
        """Ids of a text given as (text, is_markup) segments, where added tokens (control
        tokens) are recognized in markup only: content is encoded as plain text, so a
        client's "<｜User｜>" is a few ordinary tokens, never the control token.

        HF finds the added tokens of a text (leftmost-longest) and encodes the runs between
        them each on its own; this does the same with the markup's added tokens, a run
        taking in the content next to it. So, as long as no added token of the joined text
        overlaps content, the ids are those of `encode` of the joined text. (Added tokens
        are matched in the raw text, their lstrip/rstrip/single_word flags not honoured:
        exact for a tokenizer whose normalizer, if any, leaves the markup as it is and
        whose markup tokens have no such flags, as the V4 and models/tiny ones.)"""
        pieces = self._pieces(segments)
        runs = iter(self._plain.encode_batch(
            [text for text, is_token in pieces if not is_token], add_special_tokens=False))
        tokens = iter(self._tok.encode_batch(
            [text for text, is_token in pieces if is_token], add_special_tokens=False))
        merged = Encoding.merge([next(tokens if is_token else runs) for _, is_token in pieces],
                                growing_offsets=True)
        # what encode does after splitting: truncation, the post-processor, padding
        return self._tok.post_process(merged, None, add_special_tokens).ids

    def _pieces(self, segments: Iterable[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """(text, is_token): the markup's added tokens, and the non-empty runs of text
        (content and the markup around it) between them."""
        pieces: list[tuple[str, bool]] = []
        run = ""
        for text, is_markup in segments:
            # split with a group: texts at even places, the tokens between them
            parts = self._added_pattern.split(text) if is_markup else [text]
            for n, part in enumerate(parts):
                if n % 2 == 0:
                    run += part
                    continue
                if run:
                    pieces.append((run, False))
                pieces.append((part, True))
                run = ""
        return pieces + [(run, False)] if run else pieces

    @cached_property
    def _added_pattern(self) -> re.Pattern:
        """Any added token's text, longest first, so that a match is leftmost-longest as
        HF's; a pattern that never matches when there are none."""
        texts = sorted((t.content for t in self._tok.get_added_tokens_decoder().values()),
                       key=len, reverse=True)
        return re.compile("(" + ("|".join(map(re.escape, texts)) or "(?!)") + ")")

    @cached_property
    def _plain(self) -> _HFTokenizer:
        """The same tokenizer without its added tokens (nor truncation and padding, which
        apply to the whole text): it encodes "<｜User｜>" as the text it is. Built on first
        use (a chat request), once."""
        spec = json.loads(self._tok.to_str())
        spec.update(added_tokens=[], truncation=None, padding=None)
        return _HFTokenizer.from_str(json.dumps(spec))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (added tokens included), else None."""
        return self._tok.token_to_id(token)

    def token_text(self, token_id: int) -> str:
        return self._tok.id_to_token(token_id) or ""


def _byte_alphabet() -> dict[str, int]:
    """The byte-level alphabet: the character that stands for each byte in a ByteLevel
    vocabulary's tokens. The printable bytes ("!".."~", "\xa1".."\xac", "\xae".."\xff")
    stand for themselves; the others, in byte order, for chr(256), chr(257), ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable},
            **{chr(256 + n): b for n, b in enumerate(others)}}


BYTE_OF = _byte_alphabet()


def _byte_level(token: str) -> bytes:
    """A vocabulary token's bytes as the ByteLevel decoder reads them: each character's
    byte, or, for a token with a character outside the alphabet, its UTF-8."""
    if all(c in BYTE_OF for c in token):
        return bytes(BYTE_OF[c] for c in token)
    return token.encode()


def eos_token_id(tokenizer: Tokenizer | None, config: Mapping) -> int | None:
    """The id that ends a generation: the tokenizer's eos token where it names one, else
    config.json's eos_token_id (the one rule the engine, the runner and the server share)."""
    if tokenizer is not None and tokenizer.eos_id is not None:
        return tokenizer.eos_id
    return config.get("eos_token_id")
