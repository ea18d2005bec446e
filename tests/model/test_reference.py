"""The main model and the MTP block against outputs of the official inference code
(tests/fixtures/v4-tiny: CPU, float32, quantization simulation off)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_mtp_state
from tests.model.support import REF, Driver, assert_top5_rows, golden, reference_params

CASES = golden()
C = REF.contract
# the readable reference, and the compiled backend's loop-free graphs run eagerly
# (tests/model/test_compiled.py compiles them)
BACKENDS = ["torch", "compiled-eager"]


@pytest.fixture(scope="module")
def params():
    return reference_params()



@pytest.mark.parametrize("case", CASES, ids=lambda c: f"prompt{len(c['prompt_ids'])}")
@pytest.mark.parametrize("chunk", [128, 256, 8192])
def test_main_logprobs_at_every_position_under_every_chunking(params, case, chunk):
    seq = case["prompt_ids"] + case["greedy_ids"]
    out, _ = Driver(params).prefill(seq, chunk)
    rows = len(case["main_top5_ids"])
    assert_top5_rows(out[:rows], case["main_top5_ids"], case["main_top5_logprobs"])


def test_prompt_then_single_token_steps_match(params):
    case = CASES[-1]  # 300-token prompt: several HCA entries and many CSA entries
    prompt, greedy = case["prompt_ids"], case["greedy_ids"]
    driver = Driver(params)
    out, _ = driver.prefill(prompt, 8192)
    steps = [driver.prefill([tok], 1, start=len(prompt) + i)[0] for i, tok in enumerate(greedy)]
    rows = torch.cat([out, *steps])[: len(case["main_top5_ids"])]
    assert_top5_rows(rows, case["main_top5_ids"], case["main_top5_logprobs"])


def _free_drafts(rows: int) -> np.ndarray:
    """A draft mask that allows every token (an unconstrained row)."""
    words = (REF.architecture.CONFIG["vocab_size"] + 31) // 32
    return np.full((C.RANKS, rows, words), -1, np.int32)


def _weights_kwargs(driver: Driver, rows: int) -> dict:
    tables = driver.block_tables(rows)
    return {f"block_table_{g}": t for g, t in tables.items()} | {"pools": driver.pools,
                                                                 "weights": driver.params}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[7]],
                         ids=lambda c: f"prompt{len(c['prompt_ids'])}")
def test_greedy_continuation_through_the_kernels(params, case, backend):
    """prefill_main, then decode_b8s1 token by token: the reference's 16 greedy tokens."""
    driver = Driver(params, rank=3, row=1)
    prompt = case["prompt_ids"]
    extent = C.dispatch_extent(len(prompt))
    tokens = np.zeros((C.RANKS, C.SLOTS_PER_RANK, extent), np.int64)
    tokens[3, 1, : len(prompt)] = prompt
    lens = np.zeros((C.RANKS, C.SLOTS_PER_RANK), np.int32)
    lens[3, 1] = len(prompt)
    out = Launcher(REF.kernels.PREFILL_MAIN, backend=backend).launch(
        token_ids=tokens, start_pos=np.zeros_like(lens), chunk_lens=lens, extent=extent,
        **_weights_kwargs(driver, C.SLOTS_PER_RANK))
    produced = [int(out.logits[3, 1].argmax())]
    batch = C.DECODE_LAYOUTS[0].batch
    decode = Launcher(REF.kernels.DECODE_BY_K[0], backend=backend)
    driver.row = 5  # decode rows are numbered independently of prefill slots
    for step in range(len(case["greedy_ids"]) - 1):
        tok = np.zeros((C.RANKS, batch, 1), np.int64)
        tok[3, 5, 0] = produced[-1]
        pos = np.zeros((C.RANKS, batch), np.int32)
        pos[3, 5] = len(prompt) + step
        row_lens = np.zeros((C.RANKS, batch), np.int32)
        row_lens[3, 5] = 1
        out = decode.launch(token_ids=tok, positions=pos, row_lens=row_lens,
                            context=len(prompt) + step + 1, **_weights_kwargs(driver, batch))
        produced.append(int(out.logits[3, 5, 0].argmax()))
    assert produced == case["greedy_ids"]


def test_mtp_block_matches_at_every_position(params):
    from runtime.model.forward import logits, mtp_block
    from runtime.model.paging import Segment

    for case in CASES:
        seq = case["prompt_ids"] + case["greedy_ids"]
        driver = Driver(params)
        _, h = driver.prefill(seq, 8192)
        layer = params.args.mtp_layers[0]
        with torch.inference_mode():
            hm = mtp_block(params, layer, h[:-1], torch.tensor(seq[1:]),
                           [Segment(0, 0, 0, len(seq) - 1, 0)], driver.view(), C.TILE)
            out = logits(params, hm, params.args.prefix(layer))
        assert_top5_rows(out, case["mtp_top5_ids"], case["mtp_top5_logprobs"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_mtp_prefill_and_fused_decode_draft_like_the_reference(params, backend):
    """prefill_main -> prefill_mtp -> decode_b4s2 steps: every draft and every main row
    matches the reference; the slot is committed as the runtime would."""
    case = CASES[6]  # 200-token prompt: the MTP window is a suffix of the prompt
    prompt, greedy = case["prompt_ids"], case["greedy_ids"]
    seq, n = prompt + greedy, len(prompt)
    driver = Driver(params, rank=2, row=0)
    extent = C.dispatch_extent(n)
    tokens = np.zeros((C.RANKS, C.SLOTS_PER_RANK, extent), np.int64)
    tokens[2, 0, :n] = prompt
    lens = np.zeros((C.RANKS, C.SLOTS_PER_RANK), np.int32)
    lens[2, 0] = n
    out = Launcher(REF.kernels.PREFILL_MAIN, backend=backend).launch(
        token_ids=tokens, start_pos=np.zeros_like(lens), chunk_lens=lens, extent=extent,
        **_weights_kwargs(driver, C.SLOTS_PER_RANK))
    assert int(out.logits[2, 0].argmax()) == greedy[0]
    window = min(C.MTP_WINDOW, n)
    hidden = out.mtp_hidden.clone()
    next_ids = np.zeros((C.RANKS, C.SLOTS_PER_RANK, C.MTP_WINDOW), np.int64)
    next_ids[2, 0, : window - 1] = prompt[n - window + 1:]
    starts, rows = np.zeros_like(lens), np.zeros_like(lens)
    starts[2, 0], rows[2, 0] = n - window, window - 1
    Launcher(REF.kernels.PREFILL_MTP, backend=backend).launch(
        mtp_hidden=hidden, next_ids=next_ids, start_pos=starts, num_rows=rows,
        **{k: v for k, v in _weights_kwargs(driver, C.SLOTS_PER_RANK).items()
           if k in ("block_table_ori", "pools", "weights")})

    mtp = allocate_mtp_state(REF)
    slot, generation = 5, 7
    _set_slot(mtp.slots[2, slot], greedy[0], n, generation)
    mtp.hidden[2, slot] = hidden[2, 0, window - 1]
    layout = C.DECODE_LAYOUTS[1]
    fused = Launcher(REF.kernels.DECODE_BY_K[1], backend=backend)
    driver.row = 3
    committed = 1
    while committed < len(greedy) - 2:
        slot_ids = np.full((C.RANKS, layout.batch), -1, np.int32)
        slot_ids[2, 3] = slot
        gens = np.zeros((C.RANKS, layout.batch), np.int64)
        gens[2, 3] = generation
        tail_pos = int(mtp.slots[2, slot, FIELD.TAIL_POS])
        step = fused.launch(slot_ids=slot_ids, slot_gens=gens, mtp=mtp, context=tail_pos + 2,
                            draft_mask=_free_drafts(layout.batch),
                            **_weights_kwargs(driver, layout.batch))
        draft = int(step.draft_ids[2, 3, 0])
        assert_top5_rows(step.logits[2, 3, :1], [case["main_top5_ids"][tail_pos - 1 + 1]],
                     [case["main_top5_logprobs"][tail_pos]])
        assert draft == case["mtp_top5_ids"][tail_pos - 1][0]
        accepted = int(draft == seq[tail_pos + 1])
        if accepted:
            assert_top5_rows(step.logits[2, 3, 1:], [case["main_top5_ids"][tail_pos + 1]],
                         [case["main_top5_logprobs"][tail_pos + 1]])
        new_tail = tail_pos + 1 + accepted
        _set_slot(mtp.slots[2, slot], seq[new_tail], new_tail, generation)
        mtp.hidden[2, slot] = step.hidden[2, 3, accepted]
        committed += 1 + accepted


FIELD = REF.pools.MtpField


def _set_slot(row: torch.Tensor, tail: int, tail_pos: int, generation: int) -> None:
    row[FIELD.TAIL_TOKEN], row[FIELD.TAIL_POS] = tail, tail_pos
    row[FIELD.COMMITTED], row[FIELD.GENERATION] = tail_pos + 1, generation


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stale_generation_leaves_the_slot_and_outputs_alone(params, backend):
    driver = Driver(params, rank=1, row=0)
    mtp = allocate_mtp_state(REF)
    _set_slot(mtp.slots[1, 2], 5, 10, 4)
    layout = C.DECODE_LAYOUTS[1]
    slot_ids = np.full((C.RANKS, layout.batch), -1, np.int32)
    slot_ids[1, 0] = 2
    gens = np.full((C.RANKS, layout.batch), 3, np.int64)  # the slot moved on to generation 4
    before = driver.pools.ori[:, :, :-1].clone()        # every real page (not the scratch)
    fused = Launcher(REF.kernels.DECODE_BY_K[1], backend=backend)
    fused.logits.fill_(7.0)
    out = fused.launch(slot_ids=slot_ids, slot_gens=gens, mtp=mtp, context=12,
                       draft_mask=_free_drafts(layout.batch),
                       **_weights_kwargs(driver, layout.batch))
    assert (out.logits == 7.0).all()
    assert torch.equal(before, driver.pools.ori[:, :, :-1])
    assert mtp.slots[1, 2].tolist() == [5, 10, 11, 4]
