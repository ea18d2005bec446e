"""Marks around the client's text in a rendered prompt, so that it can be told from markup.

A chat prompt is rendered to one text (by the V4 encoder or a Jinja chat template), but it
must not be tokenized as one: a client's message that holds "<｜Assistant｜>" or "</think>"
would get those control tokens and forge a turn. So the renderer wraps each piece of client
text in an opening and a closing mark, and `split` cuts the rendered text back into
(text, is_markup) segments for Tokenizer.encode_segments, which recognizes added tokens in
markup only.

The marks hold a fresh random nonce (128 bits) per prompt, so no client text can contain
them. They are ASCII letters, digits and brackets, so they come through JSON encoding
(json.dumps, Jinja's tojson) unchanged.
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Collection
from typing import Any

Segment = tuple[str, bool]                  # (text, is_markup)
Path = tuple[str, ...]                      # keys down a JSON-like value; "*": a list's item


class ContentMarks:
    def __init__(self) -> None:
        nonce = secrets.token_hex(16)
        self.open, self.close = f"[{nonce}[", f"]{nonce}]"
        self._mark = re.compile(f"({re.escape(self.open)}|{re.escape(self.close)})")

    def wrap(self, text: str) -> str:
        """`text` between the marks; an empty text stays empty (nothing to protect, and a
        template may test it for truth)."""
        return f"{self.open}{text}{self.close}" if text else text

    def wrap_values(self, value: Any, keep: Collection[Path] = ()) -> Any:
        """A copy of a JSON-like value with every non-empty string wrapped but dict keys
        and the strings at the paths of `keep` (those a template compares): a path is the
        keys from the value down, "*" standing for any item of a list, so ("*", "role")
        is the role of each item and no other "role"."""
        return self._wrap(value, (), frozenset(keep))

    def _wrap(self, value: Any, path: Path, keep: frozenset[Path]) -> Any:
        if isinstance(value, str):
            return value if path in keep else self.wrap(value)
        if isinstance(value, list):
            return [self._wrap(v, (*path, "*"), keep) for v in value]
        if isinstance(value, dict):
            return {k: self._wrap(v, (*path, k), keep) for k, v in value.items()}
        return value

    def split(self, rendered: str) -> list[Segment] | None:
        """The rendered text without its marks, as segments: text between an opening and
        a closing mark is content (is_markup False), the rest markup. None when the marks
        do not pair up (a renderer that cut, reordered or nested them)."""
        segments: list[Segment] = []
        inside = False
        for n, part in enumerate(self._mark.split(rendered)):
            if n % 2 == 0:                  # re.split: texts at even places, marks between
                if part:
                    segments.append((part, not inside))
            elif (part == self.open) == inside:
                return None
            else:
                inside = not inside
        return None if inside else segments
