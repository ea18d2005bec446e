"""The intake (runtime/engine/intake.py): a body's prompts are checked once however many
choices share them, a step adds a bounded share of what was sent (the bodies taking
turns), an abort of a request still pending drops it in O(1), and a refusal is sorted by
whose fault it is. Against an engine that records what it is asked (no model)."""
from __future__ import annotations

import time

import msgspec
import pytest

from runtime.core.config import EngineConfig
from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.engine.client import RequestFailedError
from runtime.engine.intake import Abort, Add, Choice, Intake, Refused
from runtime.planning.admission import Admission
from runtime.process.core_messages import ToCore
from tests.model.support import REF

PARAMS = SamplingParams(max_tokens=4)
ADMISSION = Admission.plan(EngineConfig(spec="reference"), REF)


class _Engine:
    """Records adds (with their group) and aborts; counts the prompt tokens checked."""

    def __init__(self, raises: Exception | None = None):
        self.raises, self.added, self.aborted, self.params = raises, [], [], []
        self.tokenizer = None
        self.admission = self
        self.checked = 0

    def check_prompt(self, ids):
        self.checked += len(ids)
        ADMISSION.check_prompt(ids)

    def add_request(self, prompt, params, request_id, group=None):
        if self.raises is not None:
            raise self.raises
        self.added.append((request_id, group, prompt))
        self.params.append(params)

    def abort(self, request_id):
        self.aborted.append(request_id)


def _body(name: str, prompts: list[list[int]], n: int) -> Add:
    return Add(prompts, PARAMS, [Choice(f"{name}-{p * n + j}", p, j)
                                 for p in range(len(prompts)) for j in range(n)], name)


def _drain(intake: Intake) -> list[list[str]]:
    """The request ids each step added, until nothing is pending."""
    steps = []
    while intake.pending:
        before = len(intake.engine.added)
        intake.admit()
        steps.append([rid for rid, _, _ in intake.engine.added[before:]])
    return steps


def test_a_bodys_prompt_is_checked_once_whatever_its_choices():
    engine = _Engine()
    intake = Intake(engine, budget=64, token_budget=10**6)
    prompt = list(range(2, 502))
    intake.put(_body("b", [prompt, prompt[:7]], 300))
    steps = _drain(intake)
    assert engine.checked == 507                  # each prompt once, not 300 times
    assert len(engine.added) == 600 and {g for _, g, _ in engine.added} == {"b"}
    assert all(ids is prompt for _, _, ids in engine.added[:300])   # shared, never copied
    assert max(map(len, steps)) == 64 and len(steps) == 10
    assert [p.seed for p in engine.params[:3]] == [0, 1, 2]    # each choice its own seed
    assert all(p.max_tokens == 4 for p in engine.params)


def test_a_step_checks_a_bounded_number_of_prompt_tokens():
    engine = _Engine()
    intake = Intake(engine, budget=64, token_budget=1000)
    intake.put(_body("b", [[5] * 600 for _ in range(10)], 1))
    assert [len(s) for s in _drain(intake)] == [2, 2, 2, 2, 2]


def test_bodies_take_turns_so_a_small_one_is_added_in_the_next_step():
    engine = _Engine()
    intake = Intake(engine, budget=8, token_budget=10**6)
    intake.put(_body("big", [[5, 6]], 10_000))
    intake.admit()
    intake.put(_body("small", [[7]], 3))
    step = _drain(intake)[0]
    assert {rid.split("-")[0] for rid in step} == {"big", "small"}
    assert sum(rid.startswith("small") for rid in step) == 3 and len(step) == 8


def test_aborting_pending_requests_costs_o1_each_and_drops_them():
    engine = _Engine()
    intake = Intake(engine, budget=64, token_budget=10**6)
    body = _body("b", [[5, 6]], 50_000)
    intake.put(body)
    intake.admit()
    ids = [c.request_id for c in body.choices]
    started = time.perf_counter()
    intake.put(Abort(ids))
    assert time.perf_counter() - started < 0.5    # a list removal per abort: minutes
    assert intake.pending == 0 and engine.aborted == ids[:64]     # the added ones
    intake.admit()
    assert len(engine.added) == 64


def test_a_bad_prompt_refuses_its_choices_and_not_the_others():
    engine = _Engine()
    intake = Intake(engine, budget=64, token_budget=10**6)
    intake.put(_body("b", [[5, 6], [5, 10**6], []], 2))
    refused = intake.admit()
    assert [r.request_id for r in refused] == ["b-2", "b-3", "b-4", "b-5"]
    assert refused[0].param == "prompt" and "outside the vocabulary" in refused[0].message
    assert "empty" in refused[2].message
    assert [rid for rid, _, _ in engine.added] == ["b-0", "b-1"]


@pytest.mark.parametrize(("raised", "expected", "param"), [
    (InvalidParam("max_tokens", "too many"), InvalidParam, "max_tokens"),
    (ValueError("never fits"), ValueError, None),
    (KeyError("bug"), RequestFailedError, None)])
def test_a_refusal_is_sorted_by_whose_fault_it_is(raised, expected, param):
    intake = Intake(_Engine(raised), budget=4, token_budget=100)
    intake.put(Add([[1, 2]], PARAMS, [Choice("r", 0)]))
    [refused] = intake.admit()
    assert isinstance(refused, Refused) and refused.client_error == (expected is not
                                                                      RequestFailedError)
    error = refused.error()
    assert type(error) is expected and getattr(error, "param", None) == param
    assert "request r failed: KeyError" in str(error) if expected is RequestFailedError \
        else str(error) == str(raised)


def test_a_text_prompt_needs_a_tokenizer():
    intake = Intake(_Engine(), budget=4, token_budget=100)
    intake.put(Add(["a prompt"], PARAMS, [Choice("r", 0)]))
    [refused] = intake.admit()
    assert refused.client_error and "tokenizer" in refused.message


def test_a_body_crosses_to_a_core_with_its_prompt_once():
    prompt = list(range(1000))
    one = msgspec.msgpack.encode(_body("b", [prompt], 1))
    many = msgspec.msgpack.encode(_body("b", [prompt], 64))
    per_choice = (len(many) - len(one)) / 63        # an id and a seed, not params nor prompt
    assert per_choice < 16
    got = msgspec.msgpack.Decoder(ToCore).decode(many)
    assert got.prompts == [prompt] and got.group == "b" and len(got.choices) == 64
