"""Structured outputs through the engine: every backend, MTP on and off, preemption, and
a constraint that fails alone."""
from __future__ import annotations

import json

import jsonschema
import pytest

import generated
from runtime.core.config import EngineConfig
from runtime.core.sampling_params import SamplingParams
from runtime.engine.engine import Engine
from runtime.planning import capacity
from runtime.text.grammar import GrammarError, StructuredOutputs, Vocabulary
from runtime.text.tokenizer import Tokenizer
from runtime.weights.loader import load_params
from tests.conftest import REPO
from tests.model.support import FIXTURE
from tests.runtime.engine_support import assert_all_free, random_prompt

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "tag": {"enum": ["red", "green", "blue"]},
    "ok": {"type": "boolean"},
    "name": {"type": "string", "maxLength": 8}},
    "required": ["id", "tag", "ok", "name"], "additionalProperties": False}
JSON = StructuredOutputs(json=json.dumps(SCHEMA))


MODEL = REPO / "models" / "tiny"        # a byte-level BPE vocabulary, as real checkpoints
TINY = generated.load("tiny")


@pytest.fixture(scope="module")
def params():
    return load_params(MODEL, TINY)


def make_engine(params, **overrides) -> Engine:
    config = EngineConfig(spec="tiny", model=MODEL, **overrides)
    return Engine(config, TINY, params, Tokenizer(MODEL))


PROMPTS = [random_prompt(40 + 37 * i, i) for i in range(6)]
GREEDY_JSON = SamplingParams(temperature=0, max_tokens=80, structured=JSON)


@pytest.fixture(scope="module")
def plain_json(params) -> list[list[int]]:
    engine = make_engine(params, num_speculative_tokens=0, backend="compiled-eager")
    outputs = engine.generate(PROMPTS, GREEDY_JSON)
    for out in outputs:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), SCHEMA)
    return [o.output_ids for o in outputs]


@pytest.mark.parametrize("backend, k, policy", [
    ("torch", 3, "fixed"), ("compiled-eager", 1, "fixed"), ("compiled-eager", 3, "adaptive")])
def test_constrained_greedy_output_validates_and_mtp_keeps_it(params, plain_json, backend, k,
                                                              policy):
    """The mask is applied at the tail and after each draft, so verification under a
    grammar is as lossless as without one: MTP with 1 or 3 drafts, or K chosen per step,
    gives MTP off's tokens."""
    engine = make_engine(params, num_speculative_tokens=k, backend=backend,
                         speculative_policy=policy)
    assert [o.output_ids for o in engine.generate(PROMPTS, GREEDY_JSON)] == plain_json
    assert engine.stats.accepted_tokens > 0
    if policy == "fixed":
        assert engine.stats.accepted_per_position[k - 1] > 0
    assert_all_free(engine)


def test_seeded_choices_stay_in_the_choice_and_repeat(params):
    choice = StructuredOutputs(choice=("alpha", "beta", "gamma delta"))
    engine = make_engine(params, backend="torch")
    prompts = [random_prompt(30, i) for i in range(8)]
    texts = {}
    for seed in (1, 2):
        runs = [engine.generate(prompts, SamplingParams(temperature=1.5, seed=seed,
                                                        max_tokens=12, structured=choice))
                for _ in range(2)]
        assert [o.text for o in runs[0]] == [o.text for o in runs[1]]
        texts[seed] = [o.text for o in runs[0]]
        assert set(texts[seed]) <= set(choice.choice)
    assert texts[1] != texts[2]
    assert_all_free(engine)


def test_preemption_keeps_constrained_outputs(params):
    """Decoding past position 131 needs a second CSA block, which only preemption frees:
    a preempted request comes back with its output, and its matcher reads it again."""
    prompts = [random_prompt(120, i) for i in range(24)]
    text = SamplingParams(temperature=0, max_tokens=24,     # 20 words: never done by then
                          structured=StructuredOutputs(regex="[a-z]{1,9}( [a-z]{1,9}){19,}"))
    calm = make_engine(params, num_speculative_tokens=1,
                       backend="compiled-eager").generate(prompts, text)
    tight = capacity.bytes_for(TINY.pools.GROUPS, 8, 128 * 4)   # a block for 4 requests a rank
    engine = make_engine(params, num_speculative_tokens=1, kv_cache_memory=tight,
                         max_model_len=512, enable_prefix_caching=False,
                         backend="compiled-eager")
    pressed = engine.generate(prompts, text)
    assert engine.scheduler.num_preemptions > 0
    assert [o.output_ids for o in pressed] == [o.output_ids for o in calm]
    assert all(o.text.replace(" ", "").isalpha() for o in pressed if o.text)
    assert_all_free(engine)


def test_a_constraint_that_does_not_compile_fails_its_request_alone(params):
    """The API refuses such a constraint with a 400; a library caller that passes one
    gets an error output for that request, and the others run on."""
    engine = make_engine(params, backend="torch")
    bad = engine.add_request(random_prompt(50, 1), SamplingParams(
        temperature=0, max_tokens=8, structured=StructuredOutputs(regex="[a-z")))
    good = engine.add_request(random_prompt(50, 2), SamplingParams(temperature=0, max_tokens=8,
                                                                   ignore_eos=True))
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
    assert outputs[bad.request_id].finish_reason == "error"
    assert "regex" in outputs[bad.request_id].error
    assert outputs[good.request_id].finish_reason == "length"
    assert len(outputs[good.request_id].output_ids) == 8
    assert_all_free(engine)


def test_a_tokenizer_the_grammar_engine_cannot_read_is_a_clear_error():
    """The reference fixture's WordPiece vocabulary has no byte-level form."""
    with pytest.raises(GrammarError, match="cannot read this checkpoint's tokenizer"):
        Vocabulary(FIXTURE / "tokenizer.json", 512, None)


def test_a_grammar_compiles_once_off_the_step_for_every_request_using_it(params,
                                                                          monkeypatch):
    """Three requests with one constraint: one compile, on the runner's grammar thread
    (the engine schedules them when it is done), never on the thread that steps; each
    request follows its own copy of the compiled matcher."""
    import threading

    import llguidance

    real, threads = llguidance.LLMatcher, []

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    for name in ("grammar_from_json_schema", "grammar_from_regex", "grammar_from_lark"):
        setattr(spy, name, getattr(real, name))
    monkeypatch.setattr(llguidance, "LLMatcher", spy)
    # a schema no other test compiles (the vocabulary's compiled grammars outlive engines)
    schema = dict(SCHEMA, properties=dict(SCHEMA["properties"], once={"type": "null"}))
    constrained = SamplingParams(temperature=0, max_tokens=60,
                                 structured=StructuredOutputs(json=json.dumps(schema)))
    engine = make_engine(params, num_speculative_tokens=1, backend="torch")
    outputs = engine.generate([random_prompt(30 + i, i) for i in range(3)], constrained)
    assert threads and all(name.startswith("v4serve-grammar") for name in threads)
    assert len(threads) == 1
    for out in outputs:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), schema)
    assert_all_free(engine)
