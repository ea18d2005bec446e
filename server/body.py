"""A request body as JSON, strictly: UTF-8, finite numbers, bounded nesting, no lone
surrogates. Whatever a client sends, the answer is a value or a 400, never a 500.

Python's parser alone accepts `NaN`, `Infinity` and `1e999` (as inf), recurses once per
nesting level (100,000 `[` raise RecursionError), and decodes `"\\ud800"` into a string
that no UTF-8 encoder (the tokenizer, the JSON response) can take back. The nesting and
surrogate checks run on the raw bytes with regular expressions and numpy, so a large body
of token ids costs no Python-level walk; a non-finite number is located (its field named
in the 400) only when there is one.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from server.protocol import bad_request

MAX_DEPTH = 64          # arrays and objects nested deeper than this are refused

_ESCAPE = re.compile(rb"\\.", re.DOTALL)              # one escape pair inside a string
_STRING = re.compile(rb'"[^"]*"')                       # a string with its escapes removed
_ESCAPED_BACKSLASH = re.compile(rb"\\\\")
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class NonFinite:
    """Where the parser met NaN, Infinity, -Infinity or a number beyond a double."""

    def __init__(self, literal: str):
        self.literal = literal


def parse_json(body: bytes) -> Any:
    """The JSON value of a request body, or a 400 saying what is wrong with it."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the body is not valid UTF-8: {exc}") from None
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and nesting_depth(body) > MAX_DEPTH:
        raise bad_request(f"the body nests arrays and objects deeper than {MAX_DEPTH} levels")
    if _has_lone_surrogate(body):
        raise bad_request("the body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                          "without its pair), which is not a character")
    found: list[NonFinite] = []
    try:
        value = json.loads(body, parse_constant=lambda lit: _mark(found, lit),
                           parse_float=lambda lit: _float(found, lit))
    except RecursionError:
        raise bad_request(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:       # JSONDecodeError, integers of more than 4300 digits
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    if found:
        path = locate(value, found[0])
        raise bad_request(f"{path or 'the body'}: {found[0].literal} is not a finite number; "
                          "only finite numbers are accepted", path or None)
    return value


def nesting_depth(body: bytes) -> int:
    """Deepest nesting of arrays and objects outside strings (valid JSON or not)."""
    text = _STRING.sub(b"", _ESCAPE.sub(b"", body))
    brackets = np.frombuffer(text.translate(None, _NOT_BRACKETS), np.uint8)
    if not brackets.size:
        return 0
    opens = (brackets == ord("[")) | (brackets == ord("{"))
    return int(np.cumsum(np.where(opens, 1, -1)).max())


def locate(value: Any, target: object, path: str = "") -> str | None:
    """The path of `target` inside `value` (`messages[2].content`), or None."""
    if value is target:
        return path
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        step = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        found = locate(item, target, step)
        if found is not None:
            return found
    return None


def _has_lone_surrogate(body: bytes) -> bool:
    if b"\\u" not in body:
        return False
    text = _SURROGATE_PAIR.sub(b"", _ESCAPED_BACKSLASH.sub(b"", body))
    return _SURROGATE.search(text) is not None


def _mark(found: list[NonFinite], literal: str) -> NonFinite:
    found.append(NonFinite(literal))
    return found[-1]


def _float(found: list[NonFinite], literal: str) -> float | NonFinite:
    value = float(literal)
    return value if math.isfinite(value) else _mark(found, literal)
