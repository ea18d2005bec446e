"""The DeepSeek V4.1 forward (torch, float32) through the paged pools against the official
V4.1 code's outputs (tests/fixtures/v41-tiny/golden.json: CPU, float32, quantization
simulation off): every golden row's top-5 log-probs within 1e-4 and its top-1, whole
prompts, chunked, one token at a time, and several requests in one launch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.support import (
    V41Driver,
    assert_top5_rows,
    v41_golden,
    v41_params,
    v41_small_pages,
)

CASES = v41_golden()
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # tiny tensors


@pytest.fixture(scope="module")
def params():
    torch.backends.cuda.matmul.allow_tf32 = False
    return v41_params()


def _sequence(case: dict) -> list[int]:
    return case["prompt_ids"] + case["greedy_ids"]


def _assert_rows(logits: torch.Tensor, case: dict) -> None:
    rows = len(case["main_top5_ids"])
    assert_top5_rows(logits[:rows], case["main_top5_ids"], case["main_top5_logprobs"])


def _max_error(logits: torch.Tensor, case: dict) -> float:
    ours = torch.log_softmax(logits.float(), -1)[: len(case["main_top5_ids"])]
    got = ours.gather(1, torch.tensor(case["main_top5_ids"])).numpy()
    return float(np.abs(got - np.array(case["main_top5_logprobs"])).max())


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"prompt{len(c['prompt_ids'])}")
@pytest.mark.parametrize("chunk", [8192, 128, 37])
def test_logprobs_at_every_position_under_every_chunking(params, case, chunk):
    """8192: the whole sequence in one launch; 128: the chunk size of the acceptance;
    37: odd chunks, so that ratio-2 groups and candidate blocks straddle launches."""
    _assert_rows(V41Driver(params).feed(_sequence(case), chunk), case)


@pytest.mark.parametrize("tile", [5, 128])
def test_query_tiles_do_not_change_the_result(params, tile):
    """Tiles split the indexer's and the candidate source's rows (published per tile)."""
    case = CASES[-1]
    _assert_rows(V41Driver(params, tile=tile).feed(_sequence(case), 128), case)


def test_pages_of_a_few_rows(params):
    """Windows in pages of 32 rows (a ring of 6), entries in pages of 16: the prompt
    spans many pages of every group, chunked so that launches end mid-page."""
    case = CASES[-1]
    driver = V41Driver(params, groups=v41_small_pages(params.args))
    _assert_rows(driver.feed(_sequence(case), 37), case)


def test_prompt_then_single_token_steps_match(params):
    """300-token prompt (150 ratio-2 entries, 300 ratio-1 entries, 38 candidate blocks),
    then each golden token in a launch of its own."""
    case = CASES[-1]
    driver = V41Driver(params)
    rows = [driver.feed(case["prompt_ids"], 8192)]
    rows += [driver.feed([token], 1) for token in case["greedy_ids"]]
    _assert_rows(torch.cat(rows), case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"prompt{len(c['prompt_ids'])}")
def test_greedy_continuation(params, case):
    """The prompt, then 15 steps each feeding our own argmax: the official 16 tokens."""
    driver = V41Driver(params)
    produced = [int(driver.feed(case["prompt_ids"], 128)[-1].argmax())]
    while len(produced) < len(case["greedy_ids"]):
        produced.append(int(driver.feed(produced[-1:], 1)[-1].argmax()))
    assert produced == case["greedy_ids"]


def test_requests_share_a_launch(params):
    """Three requests in the same launches, each on its own blocks and row: every
    segment's sources (top-k, candidate blocks) and Engram history stay its own."""
    cases = [CASES[1], CASES[3], CASES[4]]
    driver = V41Driver(params, requests=len(cases))
    sequences = [_sequence(c) for c in cases]
    out: list[list[torch.Tensor]] = [[] for _ in cases]
    for at in range(0, max(map(len, sequences)), 48):
        pieces = {r: s[at:at + 48] for r, s in enumerate(sequences) if s[at:at + 48]}
        for r, logits in driver.launch(pieces).items():
            out[r].append(logits)
    for case, rows in zip(cases, out):
        _assert_rows(torch.cat(rows), case)


def test_engram_history_before_a_chunk_matters(params, monkeypatch):
    """Chunks hashed without the ids before them (all pad) depart from the goldens: the
    comparison can fail, and the history carried across launches is what passes it."""
    import runtime.model.forward_v41 as forward_v41
    monkeypatch.setattr(forward_v41, "prior_ids",
                        lambda tokens, start, width, pad: [pad] * width)
    case = CASES[1]
    assert _max_error(V41Driver(params).feed(_sequence(case), 7), case) > 1e-2
