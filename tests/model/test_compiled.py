"""The compiled backend's model against the official outputs, and its graphs compiled:
log-probs at every position under every chunking; the MTP block at every position;
no graph break or host sync in a launch; a decode step's op count independent of its
rows; a compiled graph equal to the same graph run eagerly."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from runtime.backends.compiled import forward
from runtime.backends.compiled.graphs import Graphs
from runtime.backends.compiled.model import Call, CompiledModel
from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_mtp_state
from tests.model.support import REF, Driver, assert_top5_rows, golden, reference_params

pytestmark = pytest.mark.slow

CASES = golden()
C = REF.contract


@pytest.fixture(scope="module")
def params():
    return reference_params()


@pytest.fixture(scope="module")
def model(params):
    return CompiledModel(params, dict(REF.pools.GROUPS), Graphs("eager"))


def _pools(driver: Driver) -> dict[str, torch.Tensor]:
    return {g: getattr(driver.pools, g) for g in REF.pools.GROUPS}


def _call(driver: Driver, ids: list[int], start: int) -> Call:
    """One piece of a request on the driver's (rank, row) tables, padded to the tile."""
    tile = torch.zeros(1, C.TILE, dtype=torch.long)
    tile[0, : len(ids)] = torch.tensor(ids)
    tables = {g: torch.from_numpy(t[driver.rank, driver.row][None]).long()
              for g, t in driver.tables.items()}
    return Call(tile, torch.tensor([start]), torch.tensor([len(ids)]),
                torch.tensor([driver.rank]), tables)


def prefill_streams(model: CompiledModel, driver: Driver, seq: list[int],
                    chunk: int) -> torch.Tensor:
    """Streams [len(seq), hc, dim] of every position, chunk by chunk, tile by tile."""
    out = []
    for at in range(0, len(seq), chunk):
        for t0 in range(at, min(at + chunk, len(seq)), C.TILE):
            piece = seq[t0: min(t0 + C.TILE, at + chunk, len(seq))]
            bucket = C.context_bucket(t0 + len(piece))
            with torch.inference_mode():
                h = model.main(_call(driver, piece, t0), _pools(driver), bucket)
            out.append(h[0, : len(piece)])
    return torch.cat(out)



@pytest.mark.parametrize("case", CASES, ids=lambda c: f"prompt{len(c['prompt_ids'])}")
@pytest.mark.parametrize("chunk", [128, 256, 8192])
def test_main_logprobs_at_every_position_under_every_chunking(model, case, chunk):
    seq = case["prompt_ids"] + case["greedy_ids"]
    h = prefill_streams(model, Driver(model.params, rank=3, row=1), seq, chunk)
    rows = len(case["main_top5_ids"])
    with torch.inference_mode():
        assert_top5_rows(model.logits(h[:rows]), case["main_top5_ids"], case["main_top5_logprobs"])


def test_mtp_block_matches_at_every_position(model):
    for case in CASES:
        seq = case["prompt_ids"] + case["greedy_ids"]
        driver = Driver(model.params)
        h = prefill_streams(model, driver, seq, 8192)
        with torch.inference_mode():
            drafts = []
            for t0 in range(0, len(seq) - 1, C.TILE):   # the MTP block, tile by tile
                piece = seq[t0 + 1: t0 + 1 + C.TILE]
                call = _call(driver, piece, t0)
                streams = torch.zeros(1, C.TILE, *h.shape[1:])
                streams[0, : len(piece)] = h[t0: t0 + len(piece)]
                out = model.mtp(streams, call, _pools(driver), C.context_bucket(t0 + C.TILE))
                drafts.append(model.logits(out[0, : len(piece)], mtp=True))
        assert_top5_rows(torch.cat(drafts), case["mtp_top5_ids"], case["mtp_top5_logprobs"])


# -- no graph break, no host sync, a fixed op count ----------------------------------

SYNCS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique",
         "aten._unique2", "aten.unique_consecutive", "aten.unique_dim"}


class Ops(TorchDispatchMode):
    """Counts the aten ops a launch issues; raises on any that waits for the device
    (a value read back, a data-dependent shape)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in SYNCS or (name == "aten.index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())):
            raise AssertionError(f"{name} syncs the host inside a launch")
        self.count += 1
        return func(*args, **(kwargs or {}))


def _decode_launch(params, k: int, live: int, backend: str, keeping: bool = False):
    """A decode launch of `live` rows on fresh scratch-only tables, ready to run
    (`keeping`: the K=0 twin that keeps the MTP slots)."""
    layout = C.DECODE_LAYOUTS[k]
    kernel = REF.kernels.DECODE_KEEPING_SLOTS_BY_K[k] if keeping else REF.kernels.DECODE_BY_K[k]
    wrapper = Launcher(kernel, backend=backend)
    driver = Driver(params)
    tables = {f"block_table_{g}": np.full((C.RANKS, layout.batch, t.shape[-1]), -1, np.int32)
              for g, t in driver.tables.items()}
    for table in tables.values():            # each row of a rank its own block
        for row in range(live):
            table[row % C.RANKS, row // C.RANKS, 0] = row // C.RANKS
    shape = (C.RANKS, layout.batch)
    common = dict(pools=driver.pools, weights=params, context=300, **tables)
    if k or keeping:
        mtp = allocate_mtp_state(REF)
        slots = np.full(shape, -1, np.int32)
        for row in range(live):
            slots[row % C.RANKS, row // C.RANKS] = row // C.RANKS
            mtp.slots[row % C.RANKS, row // C.RANKS, REF.pools.MtpField.TAIL_POS] = 299
        free = np.full(shape + ((REF.architecture.CONFIG["vocab_size"] + 31) // 32,), -1, np.int32)
        return wrapper, dict(slot_ids=slots, slot_gens=np.zeros(shape, np.int64), mtp=mtp,
                             draft_mask=free, **common)
    lens = np.zeros(shape, np.int32)
    for row in range(live):
        lens[row % C.RANKS, row // C.RANKS] = 1
    return wrapper, dict(token_ids=np.ones(shape + (1,), np.int64),
                         positions=np.full(shape, 299, np.int32), row_lens=lens, **common)


@pytest.mark.parametrize("k", [0, 1])
def test_a_decode_launch_has_no_host_sync_and_a_fixed_op_count(params, k):
    counts = []
    for live in (1, 2, 8, 32):
        wrapper, kwargs = _decode_launch(params, k, live, "compiled-eager")
        args = wrapper.marshal(**kwargs)
        with Ops() as ops:
            wrapper.run(args)
        counts.append(ops.count)
    # 2, 8 or 32 rows: the same ops (one row takes a few more: einsum treats a size-1
    # dimension its own way); never more ops for more rows
    assert len(set(counts[1:])) == 1 and counts[-1] <= counts[0], counts


@pytest.mark.parametrize("backend", ["torch", "compiled-eager"])
def test_the_first_draft_takes_only_what_its_mask_allows(params, backend):
    """A constrained row's grammar mask goes into the fused launch: the MTP draft is the
    best token the grammar allows, so it can be accepted."""
    wrapper, kwargs = _decode_launch(params, 1, 8, backend)
    rows = [(row % C.RANKS, row // C.RANKS) for row in range(8)]      # the live rows
    free = wrapper.launch(**kwargs).draft_ids.clone()
    words = kwargs["draft_mask"]
    words[:] = 0
    allowed = {}
    for i, (r, b) in enumerate(rows):                 # one token, a different one per row
        token = allowed[r, b] = (int(free[r, b, 0]) + 1 + 37 * i) % 500
        words[r, b, token // 32] = np.uint32(1 << (token % 32)).view(np.int32)
    drafts = wrapper.launch(**kwargs).draft_ids
    assert {(r, b): int(drafts[r, b, 0]) for r, b in rows} == allowed


def test_the_k0_twin_gives_the_plain_decode_graphs_the_same_layouts(params, monkeypatch):
    """The K=0 kernel that keeps the MTP slots runs the main model through the plain
    decode's graphs (one per layer and row width, compiled once): a compiled graph
    checks its inputs' strides, so every graph the two share gets the same layouts."""
    layouts: dict[str, dict[str, list]] = {}
    run = Graphs.run

    def record(self, key, fn, *args, **kwargs):
        layouts[launch].setdefault(key, _strides(args))
        return run(self, key, fn, *args, **kwargs)

    monkeypatch.setattr(Graphs, "run", record)
    for launch, keeping in (("plain", False), ("keeping", True)):
        layouts[launch] = {}
        wrapper, kwargs = _decode_launch(params, 0, 8, "compiled-eager", keeping)
        wrapper.launch(**kwargs)
    shared = set(layouts["plain"]) & set(layouts["keeping"])
    assert any(key.startswith("block[") for key in shared)
    assert "mtp_kv S=1" in set(layouts["keeping"]) - shared
    assert {key: layouts["keeping"][key] for key in shared} == \
        {key: layouts["plain"][key] for key in shared}


def _strides(value) -> list:
    """Every tensor's strides in the arguments, in order."""
    if isinstance(value, torch.Tensor):
        return [value.stride()]
    if isinstance(value, dict):
        return [s for name in sorted(value) for s in _strides(value[name])]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strides(item)]
    return []


def test_the_sync_detector_catches_a_sync(params):
    with pytest.raises(AssertionError, match="_local_scalar_dense"), Ops():
        int(torch.ones(2).sum())


@pytest.mark.parametrize("k", [0, 1])
def test_every_graph_of_a_launch_traces_whole(params, k):
    """fullgraph tracing (dynamo, no code generation): a graph break or a data-dependent
    Python branch in any graph of a decode or prefill launch is an error."""
    from runtime.backends import get_backend

    for live in (1, 2):
        wrapper, kwargs = _decode_launch(params, k, live, "compiled-trace")
        wrapper.launch(**kwargs)
    graphs = get_backend("compiled-trace").graphs
    assert any(key.startswith("block[csa]") for key in graphs.seconds)
    assert "head" in graphs.seconds and (not k or "mtp_head" in graphs.seconds)


def test_a_compiled_graph_equals_the_eager_one(params, model):
    """One graph through inductor (the sliding, hash-routed block at two rows) gives the
    eager graph's result."""
    driver = Driver(params)
    seq = CASES[-1]["prompt_ids"][:2 * C.TILE]
    calls = [_call(driver, seq[:C.TILE], 0), _call(driver, seq[C.TILE:], C.TILE)]
    call = Call(*(torch.cat([getattr(c, f) for c in calls]) for f in ("ids", "start", "length",
                                                                      "rank")),
                {g: torch.cat([c.tables[g] for c in calls]) for g in calls[0].tables})
    layer = model.main_layers[0]
    h = model.embed(call.ids)
    compiled = CompiledModel(params, dict(REF.pools.GROUPS), Graphs("compile"))
    with torch.inference_mode():
        want = model.block(layer, h, call, _pools(Driver(params)), C.CONTEXT_BUCKETS[0])
        got = compiled.block(compiled.main_layers[0], h, call, _pools(Driver(params)),
                             C.CONTEXT_BUCKETS[0])
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert forward.block.__name__ == "block"
