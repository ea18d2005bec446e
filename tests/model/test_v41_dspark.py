"""The DeepSeek V4.1 DSpark drafter (runtime/model/dspark.py) against the official code's
blocks (tests/fixtures/v41-tiny/golden.json, its model.py protocol): the prompt in
chunks, then after each one-token step a block of 5 drafts from that step's position,
anchored on the next golden token: drafts, top-5 log-probs (Markov bias added) within
1e-4, raw confidences within 1e-4."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.support import FIXTURE_TOL, V41Driver, v41_golden, v41_params

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CASES = v41_golden()


@pytest.fixture(scope="module")
def params():
    return v41_params()


def _errors(drafts, row: int, block: dict) -> tuple[float, float]:
    """(max |log-prob| at the official top-5, max |confidence|) of one block."""
    ours = torch.log_softmax(drafts.logits[row], -1)
    got = ours.gather(1, torch.tensor(block["top5_ids"])).numpy()
    logprob = float(np.abs(got - np.array(block["top5_logprobs"])).max())
    confidence = float(np.abs(drafts.confidence[row].numpy() - block["confidence"]).max())
    return logprob, confidence


def _assert_block(drafts, row: int, block: dict) -> None:
    assert drafts.ids[row].tolist() == block["draft_ids"]
    assert max(_errors(drafts, row, block)) <= FIXTURE_TOL


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"prompt{len(c['prompt_ids'])}")
def test_a_block_after_every_step(params, case):
    driver = V41Driver(params)
    driver.feed(case["prompt_ids"], 128)
    for step, block in enumerate(case["dspark"]):
        driver.feed([case["greedy_ids"][step]], 1)
        assert len(driver.tokens[0]) - 1 == block["start_pos"]
        _assert_block(driver.draft({0: block["anchor_id"]}), 0, block)


def test_requests_draft_in_one_launch(params):
    """Two requests stepped and drafted together, each from its own rings."""
    cases = [CASES[1], CASES[4]]
    driver = V41Driver(params, requests=2)
    for r, case in enumerate(cases):
        driver.feed(case["prompt_ids"], 128, request=r)
    for step in range(len(cases[0]["dspark"])):
        driver.launch({r: [c["greedy_ids"][step]] for r, c in enumerate(cases)})
        drafts = driver.draft({r: c["dspark"][step]["anchor_id"] for r, c in enumerate(cases)})
        for r, case in enumerate(cases):
            _assert_block(drafts, r, case["dspark"][step])


def test_the_rings_must_follow_the_steps(params, monkeypatch):
    """Drafts from rings that missed the decode steps' main_kv rows depart: the
    comparison can fail, and writing each step's row is what passes it."""
    from runtime.model import dspark
    case = CASES[1]
    driver = V41Driver(params)
    driver.feed(case["prompt_ids"], 128)
    monkeypatch.setattr(dspark, "write_main_kv", lambda *args: None)
    worst = 0.0
    for step, block in enumerate(case["dspark"][:4]):
        driver.feed([case["greedy_ids"][step]], 1)
        worst = max(worst, *_errors(driver.draft({0: block["anchor_id"]}), 0, block))
    assert worst > 1e-2
