"""Structured outputs: a request's constraint on its output, as a token mask per sampled row.

A constraint (StructuredOutputs: a JSON schema, any JSON object, a regex, a choice of
strings or a Lark/GBNF grammar) compiles to an llguidance grammar; llguidance's matcher
follows the output token by token and gives, for the next position, a bitmask over the
vocabulary ([ceil(V / 32)] int32, bit t of word t // 32 set = token t allowed). The sampler
sets every disallowed logit to -inf (runtime/sampling/batch_sampler.py), so the mask changes which
token is drawn, never how: greedy, seeded draws and MTP verification stay what they are on
the masked distribution.

Torch-free: masks are numpy arrays here; the runner moves them to the device.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

import llguidance
import numpy as np

from runtime.text.tokenizer import Tokenizer, eos_token_id

# JSON as a model writes it: one space after ':' and ',', no free whitespace (a model that
# may add whitespace anywhere can spend its whole budget on it)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = '{"type": "object"}'
# the regex analysis a constraint may cost when it is built (llguidance's default is 1 M,
# ~20 ms; a pathological regex reached seconds): a mask step's own budget stays default
LIMITS = llguidance.LLParserLimits(initial_lexer_fuel=300_000)
COMPILED = 64           # compiled grammars a vocabulary keeps (agents resend their schemas)
_SHARED: dict[tuple, Vocabulary] = {}
_SHARED_LOCK = threading.Lock()


class GrammarError(ValueError):
    """A constraint that does not compile; the message says why."""


# what building a grammar from a client's text may raise: llguidance's parsers and
# converters raise ValueError (UnicodeError too: a lone surrogate), TypeError,
# RecursionError, and a Rust panic as pyo3's PanicException (a BaseException, caught by
# name in _refusing); json, KeyError or IndexError on an odd shape
BUILD_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError)


@contextmanager
def _refusing(what: str):
    """Whatever building or compiling a constraint raises is a GrammarError: a
    constraint is the client's text, so each failure of it is a bad request (a 400),
    never a server error. `what` prefixes the message. Only the library calls and the
    handling of their results run inside; other exceptions propagate as they are."""
    try:
        yield
    except GrammarError:
        raise
    except BUILD_ERRORS as exc:
        raise GrammarError(f"{what}{str(exc).strip() or type(exc).__name__}") from None
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise GrammarError(f"{what}the grammar library failed on it: "
                           f"{_first_line(str(exc))}") from None


@dataclass(frozen=True)
class Reasoning:
    """Free reasoning before a constraint: any text up to the end-of-thinking marker, which
    the model writes when it is done, or which is forced once `budget` tokens of reasoning
    were generated. The marker is one token (`end_id`: a tokenizer's added token, which
    llguidance reads as a special token) or, where the vocabulary has no such token, its
    text; as one token, its text may not be spelled out inside the reasoning either."""

    end: str = "</think>"
    end_id: int | None = None
    budget: int | None = None

    def lark(self) -> str:
        """The rules `start: think END answer` but for the answer's own grammar."""
        options = [] if self.budget is None else [f"max_tokens={self.budget}"]
        if self.end_id is not None:
            marker = f"<[{self.end_id}]>"
            body = f"/(?s:.*)/ & ~/(?s:.*){_regex_literal(self.end)}(?s:.*)/"
        else:          # the text ends the free lexeme (`stop`) and is then written again
            marker = json.dumps(self.end)
            options.insert(0, f"stop={marker}")
            body = "/(?s:.*)/"
        head = f"think[{', '.join(options)}]" if options else "think"
        return f"start: think {marker} @answer\n{head}: THINK\nTHINK: {body}\n"


ANYTHING = "(?s:.*)"    # the regex of an unconstrained answer (a reasoning budget alone)


@dataclass(frozen=True)
class StructuredOutputs:
    """What a request's output must match: exactly one of the constraint fields is set
    (vLLM's names); with `reasoning`, it applies after the reasoning block."""

    json: str | None = None                 # a JSON schema, as JSON text
    json_object: bool = False               # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | None = None   # exactly one of these strings
    grammar: str | None = None              # a Lark (llguidance) or GBNF grammar
    reasoning: Reasoning | None = None

    def __post_init__(self) -> None:
        given = [f.name for f in fields(self) if f.name != "reasoning"
                 and getattr(self, f.name) not in (None, False)]
        if len(given) != 1:
            raise GrammarError("structured outputs take exactly one of json, json_object, "
                               f"regex, choice or grammar; got {given or 'none'}")
        for name in ("json", "regex", "grammar"):
            _check_text(name, getattr(self, name))
        if self.choice is not None:
            if not isinstance(self.choice, tuple) or not self.choice:
                raise GrammarError("a choice must list one or more non-empty strings")
            for option in self.choice:
                _check_text("a choice", option)
        if not isinstance(self.json_object, bool):
            raise GrammarError(f"json_object must be true or false, got {self.json_object!r}")
        if self.reasoning is not None and not isinstance(self.reasoning, Reasoning):
            raise GrammarError(f"reasoning must be a Reasoning, got {self.reasoning!r}")

    def definition(self) -> str:
        """The llguidance grammar text of this constraint (not yet checked): with
        reasoning, a Lark grammar of the reasoning whose answer is the constraint's
        grammar, referenced by name."""
        answer = self._answer()
        if self.reasoning is None:
            return answer
        with _refusing("the grammar after the reasoning is not usable: "):
            grammars = _grammars(answer)
            grammars[0] = {**grammars[0], "name": "answer"}
            return json.dumps({"grammars": [{"lark_grammar": self.reasoning.lark()},
                                            *grammars]})

    def _answer(self) -> str:
        """The constraint's own grammar; GrammarError, whatever its text makes the
        library raise."""
        if self.json is not None or self.json_object:
            schema = self.json if self.json is not None else ANY_OBJECT
            with _refusing("the JSON schema is not usable: "):
                json.loads(schema)
                return llguidance.LLMatcher.grammar_from_json_schema(schema,
                                                                     defaults=JSON_OPTIONS)
        if self.regex is not None:
            with _refusing("the regex is not usable: "):
                return llguidance.LLMatcher.grammar_from_regex(self.regex)
        if self.choice is not None:
            with _refusing("the choice is not usable: "):
                return llguidance.LLMatcher.grammar_from_lark(
                    "start: " + " | ".join(json.dumps(c) for c in self.choice))
        with _refusing(""):
            return llguidance.grammar_from("grammar", self.grammar)


def _check_text(name: str, text) -> None:
    """A constraint's text is a str the grammar library can read (UTF-8: no lone
    surrogate, which JSON's \\ud800 escapes can give)."""
    if text is None:
        return
    if not isinstance(text, str):
        raise GrammarError(f"{name} must be a string, got {type(text).__name__}")
    if not text and name == "a choice":
        raise GrammarError("a choice must list one or more non-empty strings")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise GrammarError(f"{name} holds a lone surrogate (not Unicode text)") from None


class Vocabulary:
    """The checkpoint's tokenizer as llguidance sees it, with the model's vocabulary width
    (ids past the tokenizer's are never allowed) and its end-of-sequence token.

    It keeps the last COMPILED grammars it compiled, each as a matcher that has read
    nothing: a request's matcher is a copy, so a grammar is compiled once per process
    however many requests (n choices, turns of an agent) use it. `shared` gives one
    vocabulary per checkpoint in a process (the API server and an engine in a thread of
    it share their compiles). Thread-safe: requests compile on preparation threads."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_id: int | None):
        text = Path(tokenizer_json).read_text()
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        try:
            self.tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos_id)
        except ValueError as exc:
            raise GrammarError(f"structured outputs cannot read this checkpoint's "
                               f"tokenizer: {exc}") from None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def shared(tokenizer_json: Path, vocab_size: int, eos_id: int | None) -> Vocabulary:
        """The process's vocabulary of these arguments, built by the first caller (the
        others wait for it)."""
        key = (Path(tokenizer_json), vocab_size, eos_id)
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = Vocabulary(*key)
            return _SHARED[key]

    @staticmethod
    def of(tokenizer: Tokenizer, config: Mapping) -> Vocabulary:
        """The shared vocabulary of a checkpoint's tokenizer under the model's config.json
        (its vocab_size; its eos_token_id where the tokenizer names none)."""
        return Vocabulary.shared(tokenizer.path, config["vocab_size"],
                                 eos_token_id(tokenizer, config))

    def check(self, constraint: StructuredOutputs) -> None:
        """GrammarError if the constraint does not compile for this vocabulary, or cannot
        give its first mask within the limits (what the runner will do first)."""
        matcher = self.matcher(constraint)
        with _refusing(""):
            self.bitmask(matcher)
        if matcher.is_error():
            raise GrammarError(_first_line(matcher.get_error()))

    def matcher(self, constraint: StructuredOutputs) -> llguidance.LLMatcher:
        """A fresh matcher of the constraint (compiled on first use, else a copy)."""
        definition = constraint.definition()
        with self._lock:
            compiled = self._compiled.get(definition)
            if compiled is not None:
                self._compiled.move_to_end(definition)
                return compiled.deep_copy()
        with _refusing(""):
            compiled = llguidance.LLMatcher(self.tokenizer, definition, log_level=0,
                                            limits=LIMITS)
        if compiled.is_error():
            raise GrammarError(_first_line(compiled.get_error()))
        with self._lock:
            self._compiled[definition] = compiled
            while len(self._compiled) > COMPILED:
                self._compiled.popitem(last=False)
            return compiled.deep_copy()

    def bitmask(self, matcher: llguidance.LLMatcher) -> np.ndarray:
        """The next position's allowed tokens: [words] int32, padded to the model's width."""
        mask = np.zeros(self.words, np.int32)
        got = np.frombuffer(matcher.compute_bitmask(), np.int32)
        mask[: min(len(got), self.words)] = got[: self.words]
        return mask


@dataclass
class _Follower:
    matcher: llguidance.LLMatcher
    consumed: int = 0                  # output tokens the matcher has read
    mask: np.ndarray | None = None     # its mask after them, once computed


class TokenMasks:
    """The matchers of one runner's constrained requests, each kept in step with its
    request's output: before a mask is computed, the matcher reads the output tokens it
    has not seen (whatever committed them: a step, a preemption and re-admission on this
    rank, a stop), so it never depends on the order the runner sees steps in.

    mask() raises GrammarError for a request whose matcher fails (a token it refuses, a
    lexer limit); the runner asks it inside the request's own guard, so that request
    alone fails, and masks() then reads the cached masks."""

    def __init__(self, vocabulary: Vocabulary):
        self.vocabulary = vocabulary
        self._followers: dict[str, _Follower] = {}

    def mask(self, request) -> np.ndarray:
        """[words] int32: the request's mask after its output so far."""
        follower = self._follow(request)
        if follower.mask is None:
            follower.mask = self.vocabulary.bitmask(follower.matcher)
            _check(follower.matcher)
        return follower.mask

    def masks(self, requests: list) -> np.ndarray:
        """[n, words] int32: each request's mask (all ones for an unconstrained one)."""
        out = np.full((len(requests), self.vocabulary.words), -1, np.int32)
        for i, request in enumerate(requests):
            if request.params.structured is not None:
                out[i] = self.mask(request)
        return out

    def draft_masks(self, requests: list, drafts: list[list[int]],
                    tail: np.ndarray) -> np.ndarray:
        """[n, K, words]: mask j of a constrained request is its mask had it accepted its
        drafts 0..j (n lists of K); `tail` [n, words] are the masks before them. The
        drafts are followed on a copy of the matcher up to the first the grammar refuses
        (its probability is 0: it is rejected, and no later mask is read) or the
        grammar's end (nothing changes after it): the row's remaining masks keep its last
        mask. Unconstrained rows keep `tail` at every position."""
        out = np.repeat(tail[:, None], len(drafts[0]) if drafts else 0, axis=1)
        for i, (request, row) in enumerate(zip(requests, drafts)):
            if request.params.structured is None:
                continue
            matcher = self._follow(request).matcher
            for j, draft in enumerate(row):
                # a refused token would leave the matcher in its error state: check it
                # first; the request's own matcher is only read (copied at the first draft)
                if matcher.is_stopped() or matcher.validate_tokens([draft]) != 1:
                    break
                matcher = matcher.deep_copy() if j == 0 else matcher
                if not matcher.consume_token(draft):
                    break
                mask = self.vocabulary.bitmask(matcher)
                if matcher.is_error():
                    break
                out[i, j:] = mask
        return out

    def adopt(self, request_id: str, matcher: llguidance.LLMatcher) -> None:
        """A fresh matcher (Vocabulary.matcher) compiled ahead for the request."""
        self._followers[request_id] = _Follower(matcher)

    def forget(self, request_id: str) -> None:
        self._followers.pop(request_id, None)

    def _follow(self, request) -> _Follower:
        """The request's matcher, built on first use, having read its whole output."""
        follower = self._followers.get(request.request_id)
        output = request.output_ids
        if follower is None or follower.consumed > len(output):
            follower = _Follower(self.vocabulary.matcher(request.params.structured))
            self._followers[request.request_id] = follower
        if follower.consumed < len(output):
            for token in output[follower.consumed:]:
                if follower.matcher.is_stopped():     # past the grammar's end (ignore_eos)
                    break
                follower.matcher.consume_token(token)
            follower.consumed, follower.mask = len(output), None
            _check(follower.matcher)
        return follower


def _grammars(definition: str) -> list[dict]:
    """The grammars of a definition: llguidance's JSON form (an object whose "grammars"
    lists one or more objects), or Lark text (one grammar: text that is not JSON).
    GrammarError for JSON of another shape."""
    try:
        parsed = json.loads(definition)
    except ValueError:
        return [{"lark_grammar": definition}]
    grammars = parsed.get("grammars") if isinstance(parsed, dict) else None
    if not isinstance(grammars, list) or not grammars \
            or not all(isinstance(g, dict) for g in grammars):
        raise GrammarError("a grammar in JSON form must list its grammars under "
                           '"grammars" (one or more objects)')
    return grammars


def _regex_literal(text: str) -> str:
    """`text` as a regex of itself, inside a Lark /.../ (its slashes escaped too)."""
    return re.escape(text).replace("/", "\\/")


def _check(matcher: llguidance.LLMatcher) -> None:
    if matcher.is_error():
        raise GrammarError(f"the output left its grammar: {_first_line(matcher.get_error())}")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
