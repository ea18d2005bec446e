"""V4.1's Engram history as a launch takes it (engram_prior): the N - 1 raw ids before
each row, read off the request, pad ids before its start; the same whichever launch,
chunk or decode, begins at a position."""
from __future__ import annotations

import torch

from runtime.core.request import Request, Status
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import PrefillChunk
from runtime.device.engram_prior import EngramPrior
from runtime.device.launch_inputs import LaunchInputs
from tests.model.support import V41

PAD = V41.architecture.CONFIG["engram_pad_token_id"]


def _request(prompt: list[int], output: list[int] = (), rank: int = 0, slot: int = 0) -> Request:
    r = Request("r", list(prompt), SamplingParams(), arrival=0, output_ids=list(output),
                status=Status.RUNNING, rank=rank, slot=slot)
    r.num_computed = len(prompt) + len(output) - 1
    return r


def test_the_ids_before_a_position_oldest_first_pad_before_the_start():
    prior = EngramPrior(3, PAD)
    r = _request([10, 11, 12, 13], [14, 15])
    assert prior.ids(r, 0) == [PAD, PAD, PAD]
    assert prior.ids(r, 2) == [PAD, 10, 11]
    assert prior.ids(r, 5) == [12, 13, 14]       # across the prompt / output boundary
    assert prior.rows([r, r], [1, 6]).tolist() == [[PAD, PAD, 10], [13, 14, 15]]


def test_v41_launches_take_each_rows_history():
    """A chunk at 128 and a decode row: the ids just before them; empty rows pad."""
    inputs = LaunchInputs(V41, V41.contract.RANKS, torch.device("cpu"))
    assert (inputs.prior.width, inputs.prior.pad) == (3, PAD)
    r = _request(list(range(3, 303)), rank=2, slot=5)
    got = inputs.prefill([PrefillChunk(r, 1, 128, 128)], 128)["engram_prior"]
    assert got.shape == (V41.contract.RANKS, V41.contract.SLOTS_PER_RANK, 3)
    assert got[2, 1].tolist() == [128, 129, 130]             # tokens 125..127
    assert (got[0] == PAD).all() and (got[2, 0] == PAD).all()
    d = _request([7, 8], [9, 20, 21], rank=1, slot=0)        # the tail 21 at position 4
    step = inputs.decode_step([[d]], V41.kernels.DECODE_B8S1)
    row = step.tokens(0)["engram_prior"]
    assert row.shape == (V41.contract.RANKS, 8, 3) and row[1, 0].tolist() == [8, 9, 20]
