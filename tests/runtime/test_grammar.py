"""Structured outputs below the engine: constraints, masks that follow an output, and the
sampler under a mask (greedy, drawn, and MTP verification)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from runtime.core.sampling_params import SamplingParams
from runtime.device.grammar_masks import GrammarMasks
from runtime.sampling import batch_sampler
from runtime.sampling.sampling_state import row_params
from runtime.text import grammar
from runtime.text.grammar import (
    GrammarError,
    Reasoning,
    StructuredOutputs,
    TokenMasks,
    Vocabulary,
)
from runtime.text.tokenizer import Tokenizer
from tests.conftest import REPO

TINY = REPO / "models" / "tiny"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(TINY)


@pytest.fixture(scope="module")
def vocabulary(tokenizer) -> Vocabulary:
    return Vocabulary(tokenizer.path, tokenizer.vocab_size + 40, tokenizer.eos_id)


def _allowed(vocabulary: Vocabulary, mask: np.ndarray) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return set(np.nonzero(bits)[0].tolist())


def _request(so: StructuredOutputs | None, output: list[int], rid: str = "r"):
    return SimpleNamespace(request_id=rid, output_ids=output,
                           params=SamplingParams(structured=so))


def test_a_constraint_is_exactly_one_kind():
    with pytest.raises(GrammarError, match="exactly one"):
        StructuredOutputs()
    with pytest.raises(GrammarError, match="exactly one"):
        StructuredOutputs(regex="a", choice=("a",))
    for schema in ("{", "[" * 100_000, "true"):     # not JSON, too deep, not an object
        with pytest.raises(GrammarError, match="not usable"):
            StructuredOutputs(json=schema).definition()


@pytest.mark.parametrize("so, message", [
    (StructuredOutputs(json='{"type": "objec"}'), "objec"),
    (StructuredOutputs(regex="[a-z"), "regex"),
    (StructuredOutputs(grammar="start: missing_rule"), "missing_rule"),
    (StructuredOutputs(regex="[^\\x00-\\U0010FFFF]"), "."),      # matches nothing
])
def test_a_constraint_that_does_not_compile_is_refused(vocabulary, so, message):
    with pytest.raises(GrammarError, match=message):
        vocabulary.check(so)


# -- hostile constraints: every failure is a GrammarError (a 400), never another error --

DEEP = '{"type": "array", "items": ' * 5000 + "{}" + "}" * 5000
HOSTILE = {
    "type not a string": {"json": '{"type": 5}'},
    "properties a list": {"json": '{"properties": []}'},
    "ref to nothing": {"json": '{"$ref": "#/nope"}'},
    "ref not a string": {"json": '{"$ref": 5}'},
    "required not a list": {"json": '{"type": "object", "required": "a"}'},
    "enum not a list": {"json": '{"enum": 5}'},
    "negative minItems": {"json": '{"type": "array", "minItems": -1}'},
    "minItems past any number": {"json": '{"type": "array", "minItems": 1e400}'},
    "minimum past int64": {"json": '{"type": "integer", "minimum": 1e300}'},
    "multipleOf 0": {"json": '{"type": "number", "multipleOf": 0}'},
    "unknown format": {"json": '{"type": "string", "format": "nope"}'},
    "unsatisfiable": {"json": '{"allOf": [{"type": "string"}, {"type": "integer"}]}'},
    "deeply nested": {"json": DEEP},
    "pattern that does not compile": {"json": '{"type": "string", "pattern": "(("}'},
    "schema not an object": {"json": "[]"},
    "schema not JSON": {"json": "{"},
    "schema not text": {"json": {"type": "object"}},
    "huge enum": {"json": json.dumps({"enum": [f"v{i}" for i in range(50_000)]})},
    "regex that does not compile": {"regex": "(("},
    "regex backreference": {"regex": r"(a)\1"},
    "regex lookahead": {"regex": "(?=a)a"},
    "regex lone surrogate": {"regex": "\ud800"},
    "regex not text": {"regex": 5},
    "grammar lone surrogate": {"grammar": 'start: "\ud800"'},
    "grammar not text": {"grammar": 5},
    "grammar JSON": {"grammar": '{"grammars": 5}'},
    "grammar unknown rule": {"grammar": "start: foo"},
    "grammar token past the vocabulary": {"grammar": "start: <[999999999]>"},
    "grammar max_tokens past u64":
        {"grammar": "start: a\na[max_tokens=99999999999999999999]: /x*/"},
    "grammar bad %json": {"grammar": 'start: %json {"type": 5}'},
    "choice a string": {"choice": "abc"},
    "choice of numbers": {"choice": (1, 2)},
    "choice empty": {"choice": ()},
    "choice lone surrogate": {"choice": ("\ud800",)},
    "json_object not a bool": {"json_object": "yes"},
}


@pytest.mark.parametrize("reasoning", [None, Reasoning(), Reasoning(budget=3)],
                         ids=["plain", "reasoning", "budget"])
@pytest.mark.parametrize("fields", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_constraint_is_a_grammar_error(vocabulary, fields, reasoning):
    with pytest.raises(GrammarError):
        vocabulary.check(StructuredOutputs(**fields, reasoning=reasoning))


@pytest.mark.parametrize("fields", [
    {"json": '{"type": "array", "minItems": 1000000000}'},
    {"json": '{"type": "array", "minItems": 100000, "items": {"type": "integer"}}'},
    {"json": '{"type": "string", "minLength": 1000000000000}'},
    {"regex": "a{1000000}"},
    {"regex": "((a{100}){100}){100}"},
    {"grammar": "start: "},
], ids=["minItems 1e9", "minItems 1e5", "minLength 1e12", "a{1e6}", "nested repeats",
        "empty rule"])
def test_a_huge_constraint_compiles_or_is_a_grammar_error(vocabulary, fields):
    """Bounds far past any output: llguidance builds these lazily (or refuses them
    within its limits); never another exception."""
    try:
        vocabulary.check(StructuredOutputs(**fields))
    except GrammarError:
        pass


@pytest.mark.parametrize("definition", ['{"grammars": 5}', '{"grammars": []}',
                                        '{"grammars": [5]}', '{"x": 1}', "[1]", "5", "null"])
def test_a_definition_in_json_of_another_shape_is_a_grammar_error(definition):
    """JSON that is not llguidance's form (it used to index it: a TypeError or KeyError
    after reasoning, a 500)."""
    with pytest.raises(GrammarError, match="grammars"):
        grammar._grammars(definition)
    assert grammar._grammars('start: "a"') == [{"lark_grammar": 'start: "a"'}]


@pytest.mark.parametrize("error", [KeyError("k"), TypeError("t"), IndexError("i"),
                                   RecursionError("r"),
                                   UnicodeEncodeError("utf-8", "", 0, 1, "x")])
def test_whatever_the_grammar_library_raises_is_a_grammar_error(error, monkeypatch):
    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(grammar.llguidance.LLMatcher, "grammar_from_json_schema", failing)
    with pytest.raises(GrammarError, match="not usable"):
        StructuredOutputs(json="{}").definition()


def test_a_panic_in_the_grammar_library_is_a_grammar_error_and_other_errors_pass(monkeypatch):
    """pyo3 raises a Rust panic as PanicException, a BaseException: a GrammarError here;
    a KeyboardInterrupt stays what it is."""
    PanicException = type("PanicException", (BaseException,), {})
    for error, expected in ((PanicException("boom"), GrammarError),
                            (KeyboardInterrupt(), KeyboardInterrupt)):
        def failing(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(grammar.llguidance.LLMatcher, "grammar_from_regex", failing)
        with pytest.raises(expected):
            StructuredOutputs(regex="a").definition()


def test_masks_follow_the_output(vocabulary, tokenizer):
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(json=json.dumps(SCHEMA))
    text = '{"ok": true}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    for n in range(len(ids)):
        allowed = _allowed(vocabulary, masks.masks([_request(so, ids[:n])])[0])
        assert ids[n] in allowed
        assert all(tokenizer.decode(ids[:n] + [t]) and _prefix_ok(tokenizer, ids[:n] + [t])
                   for t in list(allowed)[:50])
    done = _allowed(vocabulary, masks.masks([_request(so, ids)])[0])
    assert done == {tokenizer.eos_id}
    # the model's extra vocabulary (beyond the tokenizer's) is never allowed
    assert max(_allowed(vocabulary, masks.masks([_request(so, [])])[0])) < tokenizer.vocab_size
    # an unconstrained row allows everything
    assert (masks.masks([_request(None, [])]) == -1).all()


def _prefix_ok(tokenizer: Tokenizer, ids: list[int]) -> bool:
    """The text of ids is a prefix of some JSON text of SCHEMA's shape."""
    text = tokenizer.decode(ids)
    return any(full.startswith(text) for full in ('{"ok": true}', '{"ok": false}'))


def test_a_refused_draft_leaves_the_matcher_usable(vocabulary, tokenizer):
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(choice=("yes", "no"))
    request = _request(so, [])
    refused = tokenizer.encode("{", add_special_tokens=False)[0]
    accepted = tokenizer.encode("yes", add_special_tokens=False)[0]
    tail = masks.masks([request, request])
    after = masks.draft_masks([request, request], [[refused], [accepted]], tail)
    assert after.shape == (2, 1, vocabulary.words)
    assert (after[0, 0] == tail[0]).all()               # refused: the row does not matter
    assert _allowed(vocabulary, after[1, 0]) != _allowed(vocabulary, masks.masks([request])[0])
    # the matcher still sits at the start: the same mask as a fresh one
    fresh = TokenMasks(vocabulary).masks([_request(so, [], "other")])
    assert (masks.masks([request]) == fresh).all()


def test_a_rewound_output_rebuilds_the_matcher(vocabulary, tokenizer):
    """A request whose output shrank (it cannot, but a rank may see a request again
    after it moved) gets a matcher that has read exactly its output."""
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(choice=("yes", "no"))
    ids = tokenizer.encode("yes", add_special_tokens=False)
    masks.masks([_request(so, ids)])
    assert (masks.masks([_request(so, [])]) == TokenMasks(vocabulary).masks(
        [_request(so, [], "x")])).all()


def test_unpack_mask_matches_the_bit_layout():
    rng = np.random.default_rng(0)
    words = rng.integers(-2**31, 2**31, size=(3, 4), dtype=np.int64).astype(np.int32)
    allowed = batch_sampler.unpack_mask(torch.from_numpy(words), 100)
    expect = np.unpackbits(words.view(np.uint8), bitorder="little").reshape(3, -1)[:, :100]
    assert allowed.shape == (3, 100)
    assert (allowed.numpy() == expect.astype(bool)).all()


def _rows(params: list[SamplingParams]):
    n = len(params)
    return row_params(params, list(range(1, n + 1)), [0] * n, [0] * n, torch.device("cpu"))


def test_the_sampler_draws_only_allowed_tokens():
    torch.manual_seed(0)
    logits = torch.randn(6, 64)
    allowed = torch.zeros(6, 64, dtype=torch.bool)
    allowed[:, 10:13] = True
    for temperature in (0.0, 1.0):
        rows = _rows([SamplingParams(temperature=temperature, seed=s) for s in range(6)])
        tokens, sound = batch_sampler.sample(logits, rows, None, None, allowed)
        assert sound.all() and ((tokens >= 10) & (tokens < 13)).all()
    nothing = torch.zeros_like(allowed)
    _, sound = batch_sampler.sample(logits, _rows([SamplingParams()] * 6), None, None, nothing)
    assert not sound.any()


def test_verification_keeps_no_refused_draft_and_masks_the_bonus():
    torch.manual_seed(1)
    logits = torch.randn(4, 2, 32)
    draft = logits[:, 0].argmax(-1)             # the unmasked argmax: greedy would keep it
    allowed = torch.ones(4, 2, 32, dtype=torch.bool)
    allowed[:, 0].scatter_(1, draft[:, None], False)       # ... but the grammar refuses it
    allowed[:, 1, :16] = False
    for temperature in (0.0, 1.0):
        rows = _rows([SamplingParams(temperature=temperature)] * 4)
        tokens, accepted, sound = batch_sampler.verify(logits, draft[:, None], rows, None,
                                                       None, allowed)
        assert sound.all() and not accepted.any() and (tokens[:, 0] != draft).all()
    keep = torch.ones(4, 2, 32, dtype=torch.bool)
    keep[:, 1, :16] = False
    tokens, accepted, _ = batch_sampler.verify(logits, draft[:, None], _rows([SamplingParams(
        temperature=0)] * 4), None, None, keep)
    assert (accepted == 1).all() and (tokens[:, 1] >= 16).all()

def _mask_after(vocabulary: Vocabulary, so: StructuredOutputs, output: list[int]) -> np.ndarray:
    """[words]: the mask of a fresh request that has output `output`."""
    return TokenMasks(vocabulary).masks([_request(so, output, "fresh")])[0]


def test_draft_masks_follow_k_drafts(vocabulary, tokenizer):
    """Mask j is the mask after drafts 0..j; an unconstrained row keeps the tail's; the
    request's own matcher has read none of them."""
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(json=json.dumps(SCHEMA))
    ids = tokenizer.encode('{"ok": true}', add_special_tokens=False)
    request, free = _request(so, ids[:1]), _request(None, [], "free")
    tail = masks.masks([request, free])
    after = masks.draft_masks([request, free], [ids[1:4], [5, 6, 7]], tail)
    assert after.shape == (2, 3, vocabulary.words)
    for j in range(3):
        assert (after[0, j] == _mask_after(vocabulary, so, ids[:j + 2])).all()
        assert (after[1, j] == tail[1]).all()
    assert len({frozenset(_allowed(vocabulary, m)) for m in after[0]}) == 3
    assert (masks.masks([request])[0] == _mask_after(vocabulary, so, ids[:1])).all()


def test_a_refused_draft_keeps_the_last_valid_mask_at_later_positions(vocabulary, tokenizer):
    """The second draft refused: positions 1 and 2 keep the mask after the first (the
    refused draft has probability 0 there); the first refused: every position keeps the
    tail's. The request's matcher stays where it was."""
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(json=json.dumps(SCHEMA))
    ids = tokenizer.encode('{"ok": true}', add_special_tokens=False)
    refused = ids[0]                                   # a second "{" after '{"'
    request = _request(so, ids[:1])
    tail = masks.masks([request, request])
    after = masks.draft_masks([request, request],
                              [[ids[1], refused, ids[2]], [refused, ids[1], ids[2]]], tail)
    first = _mask_after(vocabulary, so, ids[:2])
    assert refused not in _allowed(vocabulary, first)
    assert all((after[0, j] == first).all() for j in range(3))
    assert all((after[1, j] == tail[1]).all() for j in range(3))
    assert (masks.masks([request])[0] == _mask_after(vocabulary, so, ids[:1])).all()


def test_draft_masks_stop_at_the_grammars_end(vocabulary, tokenizer):
    """Drafts that end the grammar: the masks after the end stay the last one."""
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(choice=("yes",))
    ids = tokenizer.encode("yes", add_special_tokens=False)
    request = _request(so, ids[:1])
    tail = masks.masks([request])
    after = masks.draft_masks([request], [[ids[1], tokenizer.eos_id, 5]], tail)
    assert _allowed(vocabulary, after[0, 0]) == {tokenizer.eos_id}
    assert (after[0, 2] == after[0, 1]).all()


def test_allowed_after_draft_is_the_tail_then_each_drafts_mask(tokenizer):
    masks = GrammarMasks(TINY, {"vocab_size": tokenizer.vocab_size + 40}, torch.device("cpu"))
    so = StructuredOutputs(json=json.dumps(SCHEMA))
    ids = tokenizer.encode('{"ok": true}', add_special_tokens=False)
    requests = [_request(so, ids[:1]), _request(None, [], "free")]
    tail = masks.masks(requests)
    got = masks.allowed_after_draft(requests, tail, torch.tensor([ids[1:3], [5, 6]]))
    vocab = tokenizer.vocab_size + 40
    assert got.shape == (2, 3, vocab) and got.dtype == torch.bool
    words = [tail[0], *(_mask_after(masks.token_masks().vocabulary, so, ids[:j])
                        for j in (2, 3))]
    for j, mask in enumerate(words):
        assert (got[0, j] == batch_sampler.unpack_mask(torch.from_numpy(mask), vocab)).all()
    assert got[1].all()
    assert masks.allowed_after_draft(requests, None, torch.tensor([ids[1:3], [5, 6]])) is None


def test_a_draft_the_mask_refuses_ends_the_run_of_kept_drafts():
    """K = 2: draft 0 is the argmax (greedy keeps it), draft 1 is refused by the mask
    after it: no row keeps it, and the target at position 1 is allowed there. The bonus
    row's mask allows nothing, yet no row is unsound: position 2 is never committed."""
    torch.manual_seed(2)
    logits = torch.randn(16, 3, 32)
    drafts = logits[:, :2].argmax(-1)
    allowed = torch.ones(16, 3, 32, dtype=torch.bool)
    allowed[:, 1].scatter_(1, drafts[:, 1:], False)
    allowed[:, 1, :8] = False
    allowed[:, 2] = False
    for temperature in (0.0, 1.0):
        rows = _rows([SamplingParams(temperature=temperature, seed=s) for s in range(16)])
        tokens, accepted, sound = batch_sampler.verify(logits, drafts, rows, None, None,
                                                       allowed)
        assert sound.all() and (accepted <= 1).all()
        if temperature == 0.0:
            assert (accepted == 1).all() and (tokens[:, 0] == drafts[:, 0]).all()
        reached = accepted == 1
        assert reached.any() and allowed[reached, 1].gather(1, tokens[reached, 1:2]).all()


def test_an_output_the_grammar_refuses_fails_its_mask(vocabulary, tokenizer):
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(choice=("yes", "no"))
    wrong = tokenizer.encode("{", add_special_tokens=False)
    with pytest.raises(GrammarError, match="left its grammar"):
        masks.mask(_request(so, wrong))


def test_after_the_grammar_ends_only_eos_and_drafts_change_nothing(vocabulary, tokenizer):
    """ignore_eos runs past the end: the matcher stays stopped, every mask (the one after
    a draft too) allows EOS alone."""
    masks = TokenMasks(vocabulary)
    so = StructuredOutputs(choice=("yes",))
    done = tokenizer.encode("yes", add_special_tokens=False) + [tokenizer.eos_id]
    request = _request(so, done + [tokenizer.eos_id, 5])
    tail = masks.masks([request])
    assert _allowed(vocabulary, tail[0]) == {tokenizer.eos_id}
    after = masks.draft_masks([request], [[tokenizer.eos_id] * 3], tail)
    assert after.shape == (1, 3, vocabulary.words) and (after == tail[:, None]).all()



@pytest.fixture(scope="module")
def v4_vocab(tmp_path_factory) -> tuple[Tokenizer, Vocabulary]:
    """A V4-shaped vocabulary: "</think>" is one added token (llguidance reads it as a
    special token)."""
    from tests.server.v4_tokenizer import write_v4_tokenizer

    directory = write_v4_tokenizer(tmp_path_factory.mktemp("v4"))
    tok = Tokenizer(directory)
    return tok, Vocabulary(tok.path, tok.vocab_size + 8, tok.eos_id)


def _reasoning_cases(tokenizer, vocabulary, v4_vocab):
    """(tokenizer, vocabulary, the end marker's token id or None) of both kinds."""
    tok, voc = v4_vocab
    return ((tokenizer, vocabulary, None), (tok, voc, tok.token_id("</think>")))


@pytest.mark.parametrize("answer, constraint, refuses", [
    ('{"ok": true}', {"json": json.dumps(SCHEMA)}, True),
    ("yes", {"choice": ("yes", "no")}, True),
    ("any text at all", {"regex": "(?s:.*)"}, False),
])
def test_reasoning_runs_free_then_the_constraint_holds(tokenizer, vocabulary, v4_vocab,
                                                      answer, constraint, refuses):
    for tok, voc, end_id in _reasoning_cases(tokenizer, vocabulary, v4_vocab):
        so = StructuredOutputs(**constraint, reasoning=Reasoning("</think>", end_id, 40))
        ids = tok.encode("Reasoning: 17 * 23 = 391.</think>" + answer,
                         add_special_tokens=False)
        matcher = voc.matcher(so)
        assert all(matcher.consume_token(t) for t in ids), matcher.get_error()
        assert matcher.is_accepting()
        other = voc.matcher(so)         # after the reasoning, the constraint's own rules
        bad = tok.encode("Hmm.</think>maybe", add_special_tokens=False)
        taken = all(other.consume_token(t) for t in bad) and other.is_accepting()
        assert taken is not refuses


@pytest.mark.parametrize("budget", [0, 3])
def test_a_spent_reasoning_budget_forces_the_end_of_thinking(tokenizer, vocabulary,
                                                             v4_vocab, budget):
    for tok, voc, end_id in _reasoning_cases(tokenizer, vocabulary, v4_vocab):
        so = StructuredOutputs(json=json.dumps(SCHEMA),
                               reasoning=Reasoning("</think>", end_id, budget))
        matcher = voc.matcher(so)
        for token in tok.encode("The user asks for a boolean", add_special_tokens=False)[:budget]:
            assert matcher.consume_token(token)
        forced = tok.decode(matcher.compute_ff_tokens(), skip_special_tokens=False)
        assert forced.startswith("</think>")
        for token in tok.encode("</think>" + '{"ok": false}', add_special_tokens=False):
            assert matcher.consume_token(token), matcher.get_error()
        assert matcher.is_accepting()


def test_a_one_token_end_of_thinking_is_never_spelled_out_in_the_reasoning(v4_vocab):
    tok, voc = v4_vocab
    so = StructuredOutputs(regex="(?s:.*)", reasoning=Reasoning(
        "</think>", tok.token_id("</think>"), None))
    matcher = voc.matcher(so)
    for token in tok.encode("Thinking </think", add_special_tokens=False):
        assert matcher.consume_token(token)
    mask = _allowed(voc, voc.bitmask(matcher))
    assert tok.token_id("</think>") in mask
    assert not any(tok.decode([t]).startswith(">") for t in mask)
