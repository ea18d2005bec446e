"""The JSON array of calls that tool_choice "required" has the model write, read as it is
written: `[{"name": NAME, "parameters": ARGUMENTS}, ...]` (server/chat.py's schema).

A call's first piece names it as soon as its name is read, if it is one of the request's
tools (an object naming another tool is content, as in server/v4_output.py; vLLM drops
such a call), and without parallel calls a second object is content too. Its arguments
are the text of its "parameters" value as the model writes it, and stream as they come
(before the name, they wait for it). The pieces of a call join to its arguments, however
the text was split. Each feed() costs time in its text (plus a backslash held back at
most): nothing is read twice, and no text is copied but the new.

Text that leaves the array (which the JSON schema's grammar allows only where an output
is cut short) ends the reading: a call already named stays as it was streamed, and the text
read since its last piece comes back as content with everything after it; so does text
after the array's end. An output cut inside an object not yet named gives that object's
text back as content; cut inside a named call, the call keeps the arguments written so
far (finish_reason "length" says they are cut).
"""
from __future__ import annotations

import enum
import json
import re
from collections.abc import Collection

from server.v4_output import CallPiece, Parsed

SPACE = " \t\r\n"
NOT_SPACE = re.compile(r"[^ \t\r\n]")
STRING_STOP = re.compile(r'["\\]')               # in a string: its end, or an escape
CONTAINER_STOP = re.compile(r'["{}\[\]]')        # in an array or object value
SCALAR_END = re.compile(r"[^-+.0-9A-Za-z]")      # a number, true, false or null ends
KEYS = ("name", "parameters")


class Step(enum.Enum):
    """What the reader expects next."""

    OPEN = "open"              # "["
    FIRST = "first"            # "{" or "]"
    NEXT = "next"              # "," or "]"
    ITEM = "item"              # "{"
    FIRST_KEY = "first_key"    # a key, or "}"
    KEY = "key"                # a key
    COLON = "colon"
    VALUE = "value"            # a value's first character
    STRING = "string"          # inside the key or the name
    ARGUMENTS = "arguments"    # inside the parameters value
    MEMBER_END = "member_end"  # "," or "}"
    END = "end"                # whitespace after "]"
    CONTENT = "content"        # the array broke: the rest is content


# where a symbol leads from each step that expects one ("{" and "}" open and close objects)
MOVES = {Step.OPEN: {"[": Step.FIRST}, Step.FIRST: {"{": Step.FIRST_KEY, "]": Step.END},
         Step.NEXT: {",": Step.ITEM, "]": Step.END}, Step.ITEM: {"{": Step.FIRST_KEY},
         Step.FIRST_KEY: {'"': Step.STRING, "}": Step.NEXT}, Step.KEY: {'"': Step.STRING},
         Step.COLON: {":": Step.VALUE}, Step.MEMBER_END: {",": Step.KEY, "}": Step.NEXT}}


class CallArray:
    """Reads one output's array of calls. `names`: the tools a call may name (None: any);
    `parallel`: more than one call may be read."""

    def __init__(self, names: Collection[str] | None = None, parallel: bool = True):
        self._names = frozenset(names) if names is not None else None
        self._parallel = parallel
        self._step = Step.OPEN
        self._text, self._pos = "", 0      # the held text and the new; _text[:_pos] read
        self._final = False
        self._raw: list[str] = []          # text read since the last released piece
        self._calls = 0                    # calls named so far
        self._out = Parsed()
        self._object()
        self._string: list[str] = []       # the key or name being read, as written
        self._key = ""
        self._depth, self._quoted = 0, False     # of the arguments being read
        self._scalar = False

    def feed(self, text: str) -> Parsed:
        """The next piece of the output; what it decided."""
        self._text = self._text[self._pos:] + text
        self._pos = 0
        return self._run()

    def finish(self) -> Parsed:
        """The output ended: what was held back, as the output's end decides it."""
        self._final = True
        out = self._run()
        if self._step not in (Step.END, Step.CONTENT) and self._name is None:
            rest = "".join(self._raw)          # an object not named, or no object at all
            rest = rest.lstrip(SPACE + ",") if self._calls else rest
            if rest.strip(SPACE + ",]"):
                out.content += rest
        self._raw = []
        return out

    # -- reading ---------------------------------------------------------------------

    def _object(self) -> None:
        """A new object: no name, no arguments, no keys."""
        self._name: str | None = None
        self._waiting: list[str] = []      # arguments read before the name
        self._seen: set[str] = set()

    def _run(self) -> Parsed:
        while self._pos < len(self._text) and self._read():
            pass
        out, self._out = self._out, Parsed()
        return out

    def _read(self) -> bool:
        """One move from _pos; False when the rest is undecided."""
        step = self._step
        if step is Step.CONTENT:
            self._out.content += self._take(len(self._text) - self._pos, keep=False)
            return False
        if step is Step.STRING:
            return self._read_string()
        if step is Step.ARGUMENTS:
            return self._read_arguments()
        at = NOT_SPACE.search(self._text, self._pos)
        if at is None:                     # whitespace only: read, nothing decided
            self._take(len(self._text) - self._pos)
            return False
        self._take(at.start() - self._pos)
        return self._symbol(self._text[self._pos])

    def _symbol(self, char: str) -> bool:
        """The next non-space character, where the step expects a symbol."""
        if self._step is Step.VALUE:
            return self._value(char)
        to = MOVES.get(self._step, {}).get(char)
        if to is None:
            return self._break()
        if char == "{":
            if not self._parallel and self._calls:
                return self._break()       # one call only: a second is not read
            self._object()
        elif char == "}":
            return self._close_object()
        elif char == '"':                  # a key's string
            self._key, self._string = "", []
        self._step = to
        self._take(1)
        return True

    def _value(self, char: str) -> bool:
        """A member's value begins: the name's string, or the arguments."""
        if self._key == "name":
            if char != '"':
                return self._break()
            self._take(1)
            self._string, self._step = [], Step.STRING
            return True
        self._depth, self._quoted = (1, False) if char in "{[" else (0, char == '"')
        self._scalar = char not in '{["'
        if self._scalar and SCALAR_END.match(char):
            return self._break()
        self._arguments(self._take(1, keep=False))
        self._step = Step.ARGUMENTS
        return True

    def _read_string(self) -> bool:
        """Inside a key or the name: up to its closing quote."""
        end = self._string_end()
        if end is None:
            return False
        text = "".join(self._string)
        try:
            value = json.loads(f'"{text}"')
        except ValueError:
            return self._break()
        if self._key == "name":            # the name's string, else a key's
            return self._named(value)
        if value not in KEYS or value in self._seen:
            return self._break()
        self._key = value
        self._seen.add(value)
        self._step = Step.COLON
        return True

    def _string_end(self) -> int | None:
        """Read a string's characters into _string up to its closing quote (read too);
        its position, or None when the text ends first."""
        text, at = self._text, self._pos
        while True:
            stop = STRING_STOP.search(text, at)
            if stop is None or (stop.group() == "\\" and stop.end() == len(text)
                                and not self._final):
                end = len(text) if stop is None else stop.start()   # a backslash waits
                self._string.append(self._take(end - self._pos))
                return None
            if stop.group() == "\\":
                at = min(stop.end() + 1, len(text))
                continue
            self._string.append(self._take(stop.start() - self._pos))
            self._take(1)
            return stop.start()

    def _named(self, name: str) -> bool:
        if self._names is not None and name not in self._names:
            return self._break()           # not one of the request's tools
        self._name, self._calls = name, self._calls + 1
        self._raw = []                     # the object's text so far is the call's
        self._out.tool_calls.append(CallPiece(self._calls - 1, name, "".join(self._waiting)))
        self._waiting = []
        self._step = Step.MEMBER_END
        return True

    def _read_arguments(self) -> bool:
        """Inside the parameters value: its text up to its end, released as read."""
        text, at = self._text, self._pos
        while True:
            if self._scalar:
                stop = SCALAR_END.search(text, at)
                end = len(text) if stop is None else stop.start()
                self._arguments(self._take(end - self._pos, keep=False))
                if stop is not None:
                    self._step = Step.MEMBER_END
                return stop is not None
            stop = (STRING_STOP if self._quoted else CONTAINER_STOP).search(text, at)
            if stop is None or (stop.group() == "\\" and stop.end() == len(text)
                                and not self._final):
                end = len(text) if stop is None else stop.start()   # a backslash waits
                self._arguments(self._take(end - self._pos, keep=False))
                return False
            at = stop.end()
            char = stop.group()
            if char == "\\":
                at = min(at + 1, len(text))
            elif char == '"':
                self._quoted = not self._quoted
            else:
                self._depth += 1 if char in "{[" else -1
            if self._depth == 0 and not self._quoted:
                self._arguments(self._take(at - self._pos, keep=False))
                self._step = Step.MEMBER_END
                return True

    def _arguments(self, text: str) -> None:
        if not text:
            return
        if self._name is None:
            self._waiting.append(text)
            self._raw.append(text)
        else:
            self._out.tool_calls.append(CallPiece(self._calls - 1, None, text))
            self._raw = []

    def _close_object(self) -> bool:
        """An object's "}": a named call is done (with "{}" if it had no parameters)."""
        if self._name is None:
            return self._break()
        self._take(1)
        if "parameters" not in self._seen:
            self._out.tool_calls.append(CallPiece(self._calls - 1, None, "{}"))
        self._raw, self._name = [], None
        self._step = Step.NEXT
        return True

    def _break(self) -> bool:
        """The text leaves the array: what was read since the last piece, and the rest,
        is content."""
        self._out.content += "".join(self._raw)
        self._raw, self._name = [], None
        self._step = Step.CONTENT
        return True

    def _take(self, n: int, keep: bool = True) -> str:
        """Read the next n characters; `keep`: as raw text (not a released piece)."""
        text = self._text[self._pos:self._pos + n]
        self._pos += n
        if keep and text:
            self._raw.append(text)
        return text
