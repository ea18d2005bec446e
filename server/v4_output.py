"""Generated text to reasoning, content and tool calls, as DeepSeek's V4 and V4.1 formats
read it (they differ in their DSML tag names alone: server/dsml_markup.py).

The parser is incremental. Its invariant: the concatenation of everything that feed() and
finish() release depends only on the whole text, never on how it was split. To keep it, every
decision is a function of the text read so far, and the only text held back is what is still
undecided: a suffix that could grow into a delimiter, or a part of a tool call that is not
yet complete. Each feed() costs time in the new text plus that held suffix.

Tool calls stream as they are read, in OpenAI's pieces: a call's first piece names it
(once its name is complete), the pieces after it add to its JSON arguments: the opening
and a text parameter's key as soon as its kind is read, the text value as it comes
(JSON-escaped), a JSON value whole once its parameter closes, and the closing brace with
the invoke's close. A call's pieces join to the arguments of the format's rule.

    [<think>] reasoning </think> content \\n\\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls> more

(V4.1: \\n\\n<｜DSML｜ calls>...</｜DSML｜ calls>, its invoke and parameter tags likewise.)

Calls are read in the content only: the reasoning ends at "</think>" alone, as the
grammars that govern an output read it (runtime/text/grammar.Reasoning), so a block the
free reasoning holds is reasoning. A call names one of the request's tools, and without
parallel calls an output holds one call: an invoke that names another tool, or one past
the first, breaks its block (vLLM drops such a call; here its text stays, as content, and
nothing is called). A text value ends at the first close tag; a JSON value at the first
close tag outside its strings (JSON holds no "<" there), so a JSON string may hold the
close tag, and the format's JSON is read back whatever its strings say.

A tool-calls block that breaks the grammar is not a block: its raw text goes back to the
content and reading goes on there, from the point where the grammar broke. A call it had
started is closed as it stands (an open text value and its arguments closed, a JSON value
not yet complete left out), and only the text since its last piece comes back. An output
that ends inside a block whose call had started (cut by max_tokens) leaves no markup
behind: a call being read is closed, a text value without the suffix held back as a
possible start of its close. With the auto-mode grammar (server/dsml_grammar.py) a block
can only be cut, never broken.
"""
from __future__ import annotations

import enum
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field

from server import dsml_markup
from server.dsml_markup import Markup
from server.v4_encoding import END_THINK, THINK, to_json

STRING_TRUE = '" string="true">'
STRING_FALSE = '" string="false">'
NAME_END = '">'

SPACE = " \t\r\n"                    # what may stand between the tags of a block
NAME_STOP = re.compile(r'["<>\n]')   # a name ends at '"'; the others break the grammar
# in a JSON string: its end, an escape, or a control character (which no string holds raw)
STRING_STOP = re.compile(r'["\\\x00-\x1f]')


@dataclass
class CallPiece:
    """A piece of a streamed tool call."""

    index: int               # the call's: 0, 1, ... in order of appearance in this output
    name: str | None         # the first piece of a call names it; None on the others
    arguments: str           # the next piece of its JSON arguments (the format's rule)


@dataclass
class Parsed:
    """What one feed() or finish() releases."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[CallPiece] = field(default_factory=list)


class Section(enum.Enum):
    START = "start"            # reasoning, until it is known whether <think> is repeated
    REASONING = "reasoning"
    CONTENT = "content"
    BLOCK = "block"            # inside a tool-calls block


class Step(enum.Enum):
    """Where a block's reader stands; each step names what it expects next."""

    OPEN = "open"              # ">" closing the block's opening tag
    CALLS = "calls"            # an invoke, or the block's close
    CALL_NAME = "call_name"
    CALL_NAME_END = "call_name_end"
    PARAMS = "params"          # a parameter, or the invoke's close
    PARAM_NAME = "param_name"
    PARAM_KIND = "param_kind"  # string="true" or "false"
    VALUE = "value"


class Outcome(enum.Enum):
    MORE = "more"              # everything readable was read; the rest is undecided
    MOVED = "moved"
    CALL = "call"              # an invoke closed well formed
    CLOSED = "closed"          # the block closed
    BROKEN = "broken"          # the grammar broke at the reader's position


def held(text: str, start: int, delimiters: tuple[str, ...]) -> int:
    """Length of the longest suffix of text[start:] that is a proper prefix of a delimiter."""
    if not delimiters:
        return 0
    firsts = {d[0] for d in delimiters}
    for at in range(max(start, len(text) - max(len(d) for d in delimiters) + 1), len(text)):
        if text[at] in firsts:
            tail = text[at:]
            if any(len(d) > len(tail) and d.startswith(tail) for d in delimiters):
                return len(text) - at
    return 0


def json_value(text: str) -> bool:
    """Whether text is one strict JSON value (no NaN or Infinity)."""
    def reject(constant: str):
        raise ValueError(constant)
    try:
        json.loads(text, parse_constant=reject)
    except (ValueError, RecursionError):          # nested past Python's recursion limit
        return False
    return True


class Block:
    """Reads one tool-calls block from just after its opening tag ("<｜DSML｜tool_calls";
    V4.1 "<｜DSML｜ calls", `markup` says which). The grammar, in V4's tags:

        >  { <｜DSML｜invoke name="N">
               { <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter> }
             </｜DSML｜invoke> }
        </｜DSML｜tool_calls>

    with any whitespace between tags (the format writes one "\\n"; a call without
    parameters it writes with two). Names are non-empty and hold none of '"<>' or a newline;
    parameter names do not repeat within a call; a string="false" value is strict JSON.
    `names`: the tools a call may name (None: any); `room`: the calls this block may hold
    (None: any). Owns the raw text read since the last released call: it goes back as
    text if the grammar breaks."""

    def __init__(self, opening: str, names: Collection[str] | None = None,
                 room: int | None = None, markup: Markup = dsml_markup.V4):
        self.markup = markup
        self.step = Step.OPEN
        self.raw = [opening]
        self.names, self.room = names, room
        self.released = 0              # calls of this block started so far
        self.name = ""                 # of the invoke being read
        self.params: set[str] = set()  # of the invoke being read
        self.written = 0               # of its parameters released
        self.key = ""                  # of the parameter being read
        self.is_string = False
        self.open_string = False       # a text value's opening quote was released
        self.quoted = False            # a JSON value's reader is inside one of its strings
        self.pieces: list[str] = []    # of the name or JSON value being read
        self.out: list[tuple[str | None, str]] = []     # (name or None, arguments) released

    def read(self, text: str, pos: int) -> tuple[int, Outcome]:
        """Read from text[pos:]; the new position (everything before it is consumed).
        Text that released a piece of a call is the call's; the rest is kept as raw."""
        released = len(self.out)
        end, outcome = self._read(text, pos)
        if len(self.out) > released:
            self.raw = []
        elif end > pos:
            self.raw.append(text[pos:end])
        return end, outcome

    def in_call(self) -> bool:
        """Whether the reader is inside a started call."""
        return self.step in (Step.PARAMS, Step.PARAM_NAME, Step.PARAM_KIND, Step.VALUE)

    def close(self) -> None:
        """The block broke or ended inside a started call: close the call as it stands."""
        if self.in_call():
            self._arguments(('"' if self.open_string else "") + ("}" if self.written else "{}"))

    def _arguments(self, piece: str) -> None:
        self.out.append((None, piece))

    def _read(self, text: str, pos: int) -> tuple[int, Outcome]:
        step, m = self.step, self.markup
        if step is Step.OPEN:
            return self._expect(text, pos, {">": Step.CALLS})
        if step is Step.CALLS:
            full = self.room is not None and self.released >= self.room
            options = {m.calls_close: None} if full else \
                {m.invoke_open: Step.CALL_NAME, m.calls_close: None}    # full: an invoke breaks
            return self._expect(text, _skip(text, pos), options)
        if step is Step.CALL_NAME:
            return self._name(text, pos, Step.CALL_NAME_END)
        if step is Step.CALL_NAME_END:
            return self._expect(text, pos, {NAME_END: Step.PARAMS})
        if step is Step.PARAMS:
            return self._expect(text, _skip(text, pos),
                                {m.param_open: Step.PARAM_NAME, m.invoke_close: Step.CALLS})
        if step is Step.PARAM_NAME:
            return self._name(text, pos, Step.PARAM_KIND)
        if step is Step.PARAM_KIND:
            return self._expect(text, pos, {STRING_TRUE: Step.VALUE, STRING_FALSE: Step.VALUE})
        return self._value(text, pos)

    def _expect(self, text: str, pos: int,
                options: dict[str, Step | None]) -> tuple[int, Outcome]:
        """One of the literals `options` at pos; the step each leads to (None: closed)."""
        for literal, step in options.items():
            if text.startswith(literal, pos):
                return pos + len(literal), self._enter(literal, step)
        rest = text[pos:pos + max(len(o) for o in options)]
        undecided = any(o.startswith(rest) and len(o) > len(rest) for o in options)
        return pos, Outcome.MORE if undecided else Outcome.BROKEN

    def _enter(self, literal: str, step: Step | None) -> Outcome:
        """Act on a matched literal: a name's end starts a call, a text value's kind
        opens its key, an invoke's close closes the call."""
        if step is None:
            return Outcome.CLOSED
        previous, self.step = self.step, step
        if previous is Step.CALL_NAME_END:              # the call is started
            self.params, self.written = set(), 0
            self.released += 1
            self.out.append((self.name, ""))
        if literal == self.markup.invoke_close:
            self._arguments("}" if self.written else "{}")
            return Outcome.CALL
        if step is Step.VALUE:
            self.is_string, self.quoted = literal == STRING_TRUE, False
            if self.is_string:
                self._arguments(self._key() + '"')
                self.open_string = True
        return Outcome.MOVED

    def _key(self) -> str:
        """The next parameter's key in the arguments, with its separator."""
        self.written += 1
        return ("{" if self.written == 1 else ", ") + to_json(self.key) + ": "

    def _name(self, text: str, pos: int, then: Step) -> tuple[int, Outcome]:
        stop = NAME_STOP.search(text, pos)
        end = stop.start() if stop else len(text)
        self.pieces.append(text[pos:end])
        if stop is None:
            return end, Outcome.MORE
        name, self.pieces = "".join(self.pieces), []
        if stop.group() != '"' or not name:
            return end, Outcome.BROKEN
        if then is Step.PARAM_KIND:
            if name in self.params:                    # a duplicate parameter
                return end, Outcome.BROKEN
            self.key = name
            self.params.add(name)
        elif self.names is not None and name not in self.names:
            return end, Outcome.BROKEN                 # not one of the request's tools
        else:
            self.name = name
        self.step = then
        return end, Outcome.MOVED

    def _value(self, text: str, pos: int) -> tuple[int, Outcome]:
        if not self.is_string:
            return self._json(text, pos)
        param_close = self.markup.param_close
        close = text.find(param_close, pos)
        end = close if close >= 0 else len(text) - held(text, pos, (param_close,))
        if end > pos:                                   # streamed as it comes
            self._arguments(to_json(text[pos:end])[1:-1])
        if close < 0:
            return end, Outcome.MORE
        self._arguments('"')
        self.open_string = False
        self.step = Step.PARAMS
        return close + len(param_close), Outcome.MOVED

    def _json(self, text: str, pos: int) -> tuple[int, Outcome]:
        """A JSON value, whole once its close is read: the close counts outside the
        value's strings only, and a string that holds a control character breaks it."""
        at, close, m = pos, -1, self.markup
        while close < 0:
            stop = (STRING_STOP if self.quoted else m.json_stop).search(text, at)
            if stop is None:
                at = len(text) if self.quoted else \
                    len(text) - held(text, at, (m.param_close,))
                break
            char = stop.group()
            if char == '"':
                self.quoted, at = not self.quoted, stop.end()
            elif char == "\\":                   # the character it escapes is skipped
                if stop.end() == len(text):
                    at = stop.start()             # held until that character comes
                    break
                at = stop.end() + 1
            elif self.quoted:
                return stop.start(), Outcome.BROKEN
            else:
                close = stop.start()
        self.pieces.append(text[pos:at if close < 0 else close])
        if close < 0:
            return at, Outcome.MORE
        value, self.pieces = "".join(self.pieces), []
        end = close + len(m.param_close)
        if not json_value(value):
            return end, Outcome.BROKEN
        self._arguments(self._key() + value)
        self.step = Step.PARAMS
        return end, Outcome.MOVED


def _opening(text: str, pos: int, at: int) -> int:
    """Where the tool-calls start found at `at` begins: a "\\n\\n" right before it is
    part of the delimiter (held back with it, so it is still unread)."""
    return at - 2 if at - 2 >= pos and text.startswith("\n\n", at - 2) else at


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in SPACE:
        pos += 1
    return pos


class V4OutputParser:
    """Splits one output's generated text into reasoning, content and tool calls.

    reasoning: the prompt opened a thinking block, so the text up to "</think>" is reasoning
    (all of it, if "</think>" never comes); `split`: it is released as reasoning, else as
    content, tags and all (no reasoning parser: only where calls are read changes).
    tools: DSML tool-call blocks (in `markup`'s tags) in the content are parsed, each call
    naming one of `names` (None: any name), and a second call taken only with `parallel`."""

    def __init__(self, *, reasoning: bool, tools: bool, split: bool = True,
                 names: Collection[str] | None = None, parallel: bool = True,
                 markup: Markup = dsml_markup.V4):
        self._tools, self._split = tools, split
        self._markup = markup
        self._names = frozenset(names) if names is not None else None
        self._parallel = parallel
        self._section = Section.CONTENT if not reasoning else \
            Section.START if split else Section.REASONING
        self._text = ""                # held back from earlier calls + the new text
        self._pos = 0                  # _text[:_pos] is consumed
        self._final = False
        self._block: Block | None = None
        self._calls = 0                # tool calls released so far
        self._out = Parsed()

    def feed(self, text: str) -> Parsed:
        """The next piece of generated text; what it decided."""
        self._text = self._text[self._pos:] + text
        self._pos = 0
        return self._run()

    def finish(self) -> Parsed:
        """The output ended: release whatever is held back."""
        self._final = True
        return self._run()

    def _run(self) -> Parsed:
        while self._advance():
            pass
        out, self._out = self._out, Parsed()
        return out

    def _advance(self) -> bool:
        """One move; False when the rest of the text is undecided (or there is none)."""
        if self._section is Section.START:
            return self._start()
        if self._section is Section.BLOCK:
            return self._read_block()
        return self._scan()

    def _start(self) -> bool:
        """Drop a leading <think> the model repeats."""
        rest = self._text[self._pos:self._pos + len(THINK)]
        if rest == THINK:
            self._pos += len(THINK)
        elif THINK.startswith(rest) and not self._final:
            return False
        self._section = Section.REASONING
        return True

    def _delimiters(self) -> tuple[str, ...]:
        """What ends the current run of reasoning or content."""
        if self._section is Section.REASONING:
            return (END_THINK,)
        return (self._markup.calls_open,) if self._tools else ()

    def _scan(self) -> bool:
        """Reasoning or content up to the first delimiter; the undecided suffix stays."""
        text, pos, delimiters = self._text, self._pos, self._delimiters()
        calls_open = self._markup.calls_open
        hits = [(at, d) for d in delimiters if (at := text.find(d, pos)) >= 0]
        if not hits:
            undecided = (*delimiters, self._markup.calls_start) if calls_open in delimiters \
                else delimiters
            stop = len(text) - (0 if self._final else held(text, pos, undecided))
            self._emit(self._section, text[pos:stop])
            self._pos = stop
            return False
        at, delimiter = min(hits)
        start = _opening(text, pos, at) if delimiter == calls_open else at
        self._emit(self._section, text[pos:start])
        self._pos = at + len(delimiter)
        if delimiter == END_THINK:
            self._emit(self._section, "" if self._split else END_THINK)
            self._section = Section.CONTENT
        else:
            room = None if self._parallel else 1 - self._calls
            self._block = Block(text[start:self._pos], self._names, room, self._markup)
            self._section = Section.BLOCK
        return True

    def _read_block(self) -> bool:
        block = self._block
        self._pos, outcome = block.read(self._text, self._pos)
        if outcome is Outcome.CLOSED:
            self._section, self._block = Section.CONTENT, None
        elif outcome is Outcome.BROKEN:
            self._unread(block)
        elif outcome is Outcome.MORE and self._final:
            self._cut(block)
        self._release(block)
        return outcome is not Outcome.MORE or self._final

    def _release(self, block: Block) -> None:
        """The call pieces the block read, numbered across the output."""
        for name, arguments in block.out:
            if name is not None:
                self._calls += 1
            self._out.tool_calls.append(CallPiece(self._calls - 1, name, arguments))
        block.out = []

    def _unread(self, block: Block) -> None:
        """The block broke: a call it started is closed, and its raw text (since the
        last piece released) is text again."""
        block.close()
        self._section = Section.CONTENT
        self._emit(self._section, "".join(block.raw))
        self._block = None

    def _cut(self, block: Block) -> None:
        """The output ended inside the block. Once a call of the block was started, the
        block is markup: a call being read is closed and nothing else is left over;
        before, the block is read as broken (it may have been text)."""
        if not block.released:
            self._unread(block)
            return
        block.close()                  # the text held back could only begin markup
        self._pos = len(self._text)
        self._section, self._block = Section.CONTENT, None

    def _emit(self, section: Section, text: str) -> None:
        if section is Section.CONTENT or not self._split:
            self._out.content += text
        else:
            self._out.reasoning += text
