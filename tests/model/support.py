"""Test support for the model: checkpoints in the official format, and a driver that
runs one request through the pools in chunks, then token by token."""
from __future__ import annotations

import hashlib
import importlib
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from safetensors.torch import save_file

import generated
from bench.transformers_baseline import RENAMES, load_transformers, official_name  # noqa: F401
from runtime.device.pools import allocate_pools
from runtime.model.forward import logits, main_model
from runtime.model.paging import PoolView, Segment
from runtime.model.params import ModelParams
from runtime.text.tokenizer import Tokenizer
from runtime.weights.loader import load_params

REF = generated.load("reference")
ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "v4-tiny"
SPEC_KEYS = tuple(REF.architecture.CONFIG)

def export_official(state: dict[str, torch.Tensor], config: dict, out: Path,
                    mtp: dict[str, torch.Tensor]) -> Path:
    """Write a transformers state dict (plus MTP tensors) as an official checkpoint."""
    tensors = {}
    for name, tensor in state.items():
        name = official_name(name)
        if name.endswith("ffn.experts.gate_up_proj"):
            prefix, inter = name.removesuffix("gate_up_proj"), tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                tensors[f"{prefix}{e}.w1.weight"] = tensor[e, :inter]
                tensors[f"{prefix}{e}.w3.weight"] = tensor[e, inter:]
        elif name.endswith("ffn.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(tensor.shape[0]):
                tensors[f"{prefix}{e}.w2.weight"] = tensor[e]
        elif name.endswith("ffn.gate.tid2eid"):
            tensors[name] = tensor.to(torch.int32)
        else:
            tensors[name] = tensor
    tensors.update(mtp)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def randomize(model: torch.nn.Module, config: dict, seed: int) -> None:
    """A non-degenerate init of transformers' DeepseekV4ForCausalLM: transformers' own
    leaves sinks, position biases, hyper-connection bases and the router bias at zero,
    which can hide bugs; here every tensor is random and each hash row routes to distinct
    experts."""
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    for name, p in model.named_parameters():
        if name.endswith(("attn_hc.fn", "ffn_hc.fn", "hc_head.hc_fn")):
            value = normal(p.shape, 0.05)
        elif p.dim() >= 2:
            value = normal(p.shape, p.shape[-1] ** -0.5)
        elif name.endswith(("scale", "weight")):
            value = normal(p.shape, 0.1, 1.0)
        else:  # sinks, hc bases, compressor position biases
            value = normal(p.shape, 0.5)
        p.data.copy_(value)
    experts, k = config["n_routed_experts"], config["num_experts_per_tok"]
    for name, buf in model.named_buffers():
        if name.endswith("tid2eid"):
            perms = torch.stack([torch.randperm(experts, generator=gen)[:k]
                                 for _ in range(buf.shape[0])])
            buf.copy_(perms)
        elif name.endswith("e_score_correction_bias"):
            buf.copy_(normal(buf.shape, 0.1))


def spec_with_formats(base: str, formats: dict[str, str], out: Path) -> ModuleType:
    """The generated package of specs/<base>.yaml with pool groups stored in other entry
    formats (`formats`: group -> format), generated into `out` by codegen and imported."""
    text = (ROOT / "specs" / f"{base}.yaml").read_text()
    for group, fmt in formats.items():
        text, found = re.subn(rf"^(\s+{group}:\s*{{[^}}]*)}}", rf"\1, format: {fmt}}}", text,
                              count=1, flags=re.M)
        assert found, group
    name = "-".join([base, *(f"{g}_{f}" for g, f in sorted(formats.items()))])
    return generated_spec(text, name, out)


def spec_in_bfloat16(base: str, out: Path) -> ModuleType:
    """specs/<base>.yaml computing in bfloat16: its topology dtype and the groups of
    computed entries (the window, the compressed entries, the indexer keys); the
    compressor state stays float32 (as specs/tiny-bf16.yaml is made from tiny)."""
    text = (ROOT / "specs" / f"{base}.yaml").read_text()
    text, found = re.subn(r"^(\s+dtype:) float32$", r"\1 bfloat16", text, flags=re.M)
    assert found == 1
    for group in ("ori", "cmp_c128", "cmp_c4", "idx"):
        text, found = re.subn(rf"^(\s+{group}:\s*{{[^}}]*)dtype: float32", r"\1dtype: bfloat16",
                              text, count=1, flags=re.M)
        assert found, group
    return generated_spec(text, f"{base}-bf16", out)


def spec_for_config(config: dict, base: str, out: Path,
                    context_buckets: list[int] | None = None) -> ModuleType:
    """The generated package of a spec for `config` (a config.json's keys) with the
    serving choices of specs/<base>.yaml, as `v4serve spec new` writes it (and other
    decode context buckets, where the base's are too short for the model's top-k)."""
    from codegen.pipeline import load_spec
    from codegen.spec_new import render_spec, spec_from_config
    data = spec_from_config(config, load_spec(ROOT / "specs" / f"{base}.yaml"))
    if context_buckets:
        data["decode"]["context_buckets"] = context_buckets
    text = render_spec(data, "a test", base)
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]      # one package per spec text
    return generated_spec(text, f"{base}-{digest}", out)


def generated_spec(text: str, name: str, out: Path) -> ModuleType:
    """Spec YAML `text` written as `out`/<name>.yaml, generated beside any packages
    already in `out`/packages, and imported."""
    from codegen.pipeline import generate
    (out / f"{name}.yaml").write_text(text)
    generate([out / f"{name}.yaml"], out / "packages", root=out, every=False)
    if str(out / "packages") not in sys.path:
        sys.path.insert(0, str(out / "packages"))
    return importlib.import_module(name.replace("-", "_"))


def random_checkpoint(config: dict, out: Path, seed: int) -> Path:
    """An official-format float32 checkpoint of `config` with random weights drawn as
    the fixture's are (matrices at fan_in^-1/2, the embedding and compressor position
    biases at 1, mHC scales around 0.6, norms around 1, random sinks, hc bases and
    router bias, each hash row routing to distinct experts), written without building a
    transformers model, so that a large architecture is cheap to make."""
    from contract.checkpoint_layout import expected_shapes
    from contract.model_args import ModelArgs
    gen = torch.Generator().manual_seed(seed)
    experts, k = config["n_routed_experts"], config["num_experts_per_tok"]

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    tensors = {}
    for name, shape in expected_shapes(ModelArgs.from_config(config)).items():
        if name.endswith("tid2eid"):
            value = torch.stack([torch.randperm(experts, generator=gen)[:k]
                                 for _ in range(shape[0])]).to(torch.int32)
        elif name == "embed.weight":
            value = normal(shape, 1.0)
        elif name.endswith(".ape"):
            value = normal(shape, 0.5)
        elif len(shape) >= 2:
            value = normal(shape, shape[-1] ** -0.5)
        elif "hc_" in name and name.endswith("scale"):
            value = normal(shape, 0.2, 0.6)
        elif name.endswith("weight"):              # norms
            value = normal(shape, 0.1, 1.0)
        else:                                      # sinks, hc bases, the router bias
            value = normal(shape, 0.125 if name.endswith("bias") else 0.5)
        tensors[name] = value
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def real_text(checkpoint, n: int = 2000) -> list[int]:
    """The first `n` tokens of this repository's README through the checkpoint's tokenizer."""
    ids = Tokenizer(checkpoint).encode((ROOT / "README.md").read_text())
    assert len(ids) >= n
    return ids[:n]


def compare(params, exact_spec, served_spec, ids: list[int], label: str,
            within_bound: bool, least: float = 0.98, bound_quantile: float = 0.99,
            served_params=None) -> None:
    """Logits of `ids` (a prefill in chunks of 512) under `served_spec` against
    `exact_spec`: the top-1 token agrees at `least` of the positions or more, and with
    `within_bound` it changes only where the exact top-2 gap is below the
    `bound_quantile` of the positions' max |logit diff|. The figures are printed."""
    exact, _ = Driver(params, spec=exact_spec).prefill(ids, 512)
    quant, _ = Driver(served_params or params, spec=served_spec).prefill(ids, 512)
    quant = quant.float()
    assert torch.isfinite(quant).all()
    diff = (quant - exact).abs().amax(-1)
    top2 = exact.topk(2, -1).values
    gap = top2[:, 0] - top2[:, 1]
    flips = quant.argmax(-1) != exact.argmax(-1)
    bound = diff.quantile(bound_quantile).item()
    agree = 1 - flips.float().mean().item()
    print(f"\n{label}, {len(ids)} positions: top-1 agreement {agree:.4f}; max |logit diff| "
          f"per position: median {diff.median():.4f}, p99 {diff.quantile(0.99):.4f}, max "
          f"{diff.max():.4f}; "
          f"top-2 gap: median {gap.median():.4f}, largest where the token changed "
          f"{gap[flips].max().item() if flips.any() else 0.0:.4f}")
    assert agree >= least
    if within_bound:
        assert (gap[flips] < bound).all()


SERVED = {"ori": "fp8_ds", "cmp_c128": "fp8_ds", "cmp_c4": "fp8_ds", "idx": "fp4"}


def reference_params() -> ModelParams:
    return load_params(FIXTURE, REF)


FIXTURE_TOL = 1e-4    # |log-prob| difference allowed against the official outputs


def assert_top5_rows(logits: torch.Tensor, ids: list[list[int]],
                     logprobs: list[list[float]]) -> None:
    """Our log-probs at the official top-5 ids match its log-probs, row by row, and our
    argmax is its top-1."""
    ours = torch.log_softmax(logits.float(), -1)
    got = ours.gather(1, torch.tensor(ids)).numpy()
    assert np.abs(got - np.array(logprobs)).max() <= FIXTURE_TOL
    assert (ours.argmax(-1).numpy() == np.array(ids)[:, 0]).all()


def golden() -> list[dict]:
    return json.loads((FIXTURE / "golden.json").read_text())["cases"]


class Driver:
    """One request (rank, row) on fixed blocks of fresh pools of a spec (default: the
    reference spec)."""

    BLOCKS = 24  # per group; enough for the longest test prompt

    def __init__(self, params: ModelParams, rank: int = 0, row: int = 0, pools=None,
                 spec=REF):
        self.params, self.rank, self.row, self.spec = params, rank, row, spec
        self.pools = pools or allocate_pools(spec, {g: self.BLOCKS for g in spec.pools.GROUPS})
        self.tables = self.block_tables(spec.contract.SLOTS_PER_RANK)

    def block_tables(self, rows: int) -> dict[str, np.ndarray]:
        """Block tables of `rows` rows with this request's blocks on its (rank, row)."""
        tables = {}
        for name, group in self.spec.pools.GROUPS.items():
            table = np.full((self.spec.contract.RANKS, rows, group.table_width), -1, np.int32)
            width = min(group.table_width, self.BLOCKS)
            table[self.rank, self.row, :width] = np.arange(width)
            tables[name] = table
        return tables

    def view(self) -> PoolView:
        groups = self.spec.pools.GROUPS
        return PoolView({g: getattr(self.pools, g) for g in groups},
                        {g: torch.from_numpy(t) for g, t in self.tables.items()}, groups)

    def prefill(self, ids: list[int], chunk: int,
                start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [n, vocab] and streams [n, hc, dim] of every position, chunk by chunk."""
        outs, streams = [], []
        for at in range(0, len(ids), chunk):
            piece = ids[at:at + chunk]
            seg = Segment(self.rank, self.row, start + at, len(piece), 0)
            with torch.inference_mode():
                h = main_model(self.params, torch.tensor(piece), [seg], self.view(),
                               self.spec.contract.TILE)
                outs.append(logits(self.params, h))
            streams.append(h)
        return torch.cat(outs), torch.cat(streams)


def greedy_differs_only_after_near_ties(checkpoint, params, spec, other_params,
                                        other_spec, tokens: int = 32) -> int:
    """bench/code_prompts.txt, `tokens` greedy tokens under (params, spec) and under
    (other_params, other_spec): where a continuation first differs, the first's top-2
    gap there is below the error the other causes along that continuation (the p99 of
    its positions' max |logit diff|, teacher-forced on the first's tokens). Returns how
    many continuations differ (printed with each one's gap and bound)."""
    from tests.runtime.engine_support import greedy_without_scheduler
    tokenizer = Tokenizer(checkpoint)
    lines = [json.loads(line) for line in
             (ROOT / "bench" / "code_prompts.txt").read_text().splitlines() if line.strip()]
    differed = 0
    for line in lines:
        prompt = tokenizer.encode(line)
        exact = greedy_without_scheduler(params, prompt, tokens, spec)
        other = greedy_without_scheduler(other_params, prompt, tokens, other_spec)
        if other == exact:
            continue
        differed += 1
        first = next(i for i, (a, b) in enumerate(zip(exact, other)) if a != b)
        ids = prompt + exact
        logits, _ = Driver(params, spec=spec).prefill(ids, 512)
        served, _ = Driver(other_params, spec=other_spec).prefill(ids, 512)
        bound = (served.float() - logits).abs().amax(-1)[len(prompt) - 1:].quantile(0.99)
        top2 = logits[len(prompt) - 1 + first].topk(2).values
        gap = (top2[0] - top2[1]).item()
        print(f"\n{line[:40]!r}: first differs at token {first}, top-2 gap {gap:.4f}, "
              f"error bound {bound.item():.4f}")
        assert gap < bound.item()
    print(f"{differed} of {len(lines)} continuations differ")
    return differed


# --- DeepSeek V4.1 (tests/fixtures/v41-tiny: the official V4.1 code's outputs) ---

FIXTURE_V41 = Path(__file__).resolve().parent.parent / "fixtures" / "v41-tiny"
V41 = generated.load("v41_tiny")       # its architecture, 4 expert-parallel ranks


def v41_args():
    from contract.model_args import ModelArgs
    return ModelArgs.from_config(json.loads((FIXTURE_V41 / "config.json").read_text()))


def v41_params() -> ModelParams:
    """The v41-tiny checkpoint for specs/v41-tiny.yaml (float32, experts over 4 ranks)."""
    return load_params(FIXTURE_V41, V41)


def v41_golden(name: str = "golden.json") -> list[dict]:
    return json.loads((FIXTURE_V41 / name).read_text())["cases"]


def v41_small_pages(args, window_rows: int = 32, entry_rows: int = 16) -> dict:
    """The pool groups of runtime/model/V41.md section 8 with small pages, so that a
    prompt spans many: every layer's window ring (ori); for each kv-source ratio r its
    compressed KV (cmp_c{r}) and index keys (idx_c{r}), one row per r positions, and
    above ratio 1 its compressor's open group (state_c{r}, kv and score rows)."""
    from contract.abi import PoolGroup

    def group(name, layers, rows, width, policy, per_row, ring):
        return PoolGroup(name, layers=tuple(layers), rows_per_page=rows, row_width=width,
                         dtype="float32", policy=policy, tokens_per_row=per_row,
                         ring_pages=ring, table_width=ring or 64, page_bytes=rows * width * 4,
                         block_bytes=rows * width * 4 * len(layers), formula="test",
                         format="compute", rope_width=0, entry_bytes=width * 4)

    ring = -(-(args.window - 1 + 4) // window_rows) + 1
    every = range(args.n_layers + args.n_mtp_layers)      # the DSpark stages' rings too
    groups = {"ori": group("ori", every, window_rows, args.head_dim, "ring", 1, ring)}
    for r in sorted({args.ratio(s) for s in args.kv_source_layers}):
        owners = [s for s in args.kv_source_layers if args.ratio(s) == r]
        groups[f"cmp_c{r}"] = group(f"cmp_c{r}", owners, entry_rows, args.head_dim, "full",
                                    r, None)
        groups[f"idx_c{r}"] = group(f"idx_c{r}", owners, entry_rows, args.index_head_dim,
                                    "full", r, None)
        if r > 1:
            groups[f"state_c{r}"] = group(f"state_c{r}", owners, r, 2 * args.head_dim,
                                          "ring", 1, 2)
    return groups


class V41Driver:
    """Requests 0 .. requests-1 of a V4.1 model on one rank, each on blocks of its own of
    fresh pools (default: specs/v41-tiny.yaml's groups). A launch runs a piece of several
    requests at once (a segment each); the Engram history before a piece is taken from
    the request's ids fed so far."""

    BLOCKS = 24          # at most, per request and group

    def __init__(self, params: ModelParams, requests: int = 1, tile: int = 32,
                 groups=None, rank: int | None = None):
        from runtime.backends.arg_checks import torch_dtype
        rank = params.ranks // 2 if rank is None else rank     # rank 2 of the spec's 4
        self.params, self.tile, self.rank = params, tile, rank
        self.groups = groups or V41.pools.GROUPS
        self.pools, self.tables = {}, {}
        for name, g in self.groups.items():
            pages = min(g.table_width, self.BLOCKS)      # a request's; the last: scratch
            self.pools[name] = torch.zeros(
                (params.ranks, len(g.layers), requests * pages + 1, g.rows_per_page,
                 g.storage_width), dtype=torch_dtype(g.storage_dtype))
            table = torch.full((params.ranks, requests, g.table_width), requests * pages,
                               dtype=torch.int32)
            table[rank, :, :pages] = torch.arange(requests * pages).view(requests, pages)
            self.tables[name] = table
        self.tokens: list[list[int]] = [[] for _ in range(requests)]

    def view(self) -> PoolView:
        return PoolView(self.pools, self.tables, self.groups)

    def launch(self, pieces: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """One launch of `pieces` (request -> its next ids): logits [n, vocab] each."""
        from runtime.model import dspark
        from runtime.model.forward_v41 import logits, main_model, prior_ids
        args = self.params.args
        segments, priors, ids = [], [], []
        for request, piece in pieces.items():
            start = len(self.tokens[request])
            segments.append(Segment(self.rank, request, start, len(piece), len(ids)))
            priors.append(prior_ids(self.tokens[request], start, args.engram_max_ngram - 1,
                                    args.engram_pad_id))
            ids += piece
            self.tokens[request] += piece
        with torch.inference_mode():
            main = main_model(self.params, torch.tensor(ids), torch.tensor(priors), segments,
                              self.view(), self.tile)
            out = logits(self.params, main.hidden)
            if main.targets is not None:         # the drafter's rings follow the model
                main_x = dspark.main_inputs(self.params, main.targets)
                dspark.write_main_kv(self.params, main_x, segments, self.view())
        return {request: out[s.tokens] for request, s in zip(pieces, segments)}

    def draft(self, anchors: dict[int, int]):
        """One DSpark block per request (request -> the anchor, the token after its
        last fed one): runtime/model/dspark.Drafts, row i the i-th request given."""
        block = self.params.args.dspark_block_size
        rows = [Segment(self.rank, r, len(self.tokens[r]), block, i * block)
                for i, r in enumerate(anchors)]
        from runtime.model import dspark
        with torch.inference_mode():
            return dspark.draft(self.params, torch.tensor(list(anchors.values())), rows,
                                self.view())

    def feed(self, ids: list[int], chunk: int, request: int = 0) -> torch.Tensor:
        """Logits [len(ids), vocab] of ids appended to a request, `chunk` per launch."""
        return torch.cat([self.launch({request: ids[at:at + chunk]})[request]
                          for at in range(0, len(ids), chunk)])


V41_SERVED = {"ori": "fp8_32", "cmp_c": "fp4_16", "idx_c": "fp4_32"}   # by group prefix


def v41_served(groups: dict) -> dict:
    """`groups` storing V4.1's served formats (window fp8_32, compressed KV fp4_16, index
    keys fp4_32; the compressor state as it is), as specs/deepseek-v41-flash.yaml does."""
    import dataclasses

    from contract.entry_formats import entry_bytes

    def fmt(name: str) -> str:
        return next((f for prefix, f in V41_SERVED.items() if name.startswith(prefix)),
                    "compute")

    return {n: dataclasses.replace(g, format=fmt(n),
                                   entry_bytes=entry_bytes(fmt(n), g.row_width, 0, 4))
            for n, g in groups.items()}
