"""Train the embedded default model: a byte-level BPE tokenizer and a DeepSeek V4 of the
tiny spec's architecture, on the Python standard library's own source files.

    make train-tiny          # = .venv/bin/python bench/train_tiny.py --out models/tiny

The model is the project's own forward (runtime/model) run in training mode: each batch
gets fresh pools and the same kernels-free functions the torch backend calls, with the
next-token loss plus the MTP loss (weight 0.3). Routed-expert balance uses the
auxiliary-loss-free bias update. The result is an ordinary checkpoint in the official
format (bf16 matrices), loaded by the normal loader.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import generated  # noqa: E402
from contract.checkpoint_layout import expected_shapes  # noqa: E402
from contract.model_args import ModelArgs  # noqa: E402
from runtime.model import moe  # noqa: E402
from runtime.model.forward import logits, main_model, mtp_block  # noqa: E402
from runtime.model.paging import PoolView, Segment  # noqa: E402
from runtime.model.params import Experts, ModelParams  # noqa: E402
from runtime.model.rope import Rope  # noqa: E402

SPEC = generated.load("tiny")
ARGS = ModelArgs.from_config(SPEC.architecture.CONFIG)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MTP_WEIGHT = 0.3


# -- corpus and tokenizer --------------------------------------------------------------


def corpus_files() -> list[Path]:
    """The interpreter's standard-library .py files (PSF licence), tests excluded."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"}
    return sorted(p for p in stdlib.rglob("*.py")
                  if not skip & set(p.relative_to(stdlib).parts) and p.stat().st_size < 400_000)


def split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """Every 25th file is held out for perplexity."""
    return [f for i, f in enumerate(files) if i % 25], [f for i, f in enumerate(files)
                                                        if i % 25 == 0]


def train_tokenizer(files: list[Path], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(f) for f in files], trainer)
    return tok


def token_stream(tok, files: list[Path]) -> torch.Tensor:
    """All files as one stream, each document as <bos> text <eos>."""
    ids: list[int] = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        ids += [0] + tok.encode(text).ids + [1]
    return torch.tensor(ids, dtype=torch.long)


# -- parameters ------------------------------------------------------------------------


def init_params(seed: int) -> dict[str, torch.Tensor]:
    """Every official tensor of the architecture, initialised for training."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(ARGS).items():
        if name.endswith("tid2eid"):
            rows = [torch.randperm(ARGS.n_experts, generator=gen)[: ARGS.n_active]
                    for _ in range(shape[0])]
            tensors[name] = torch.stack(rows).to(torch.int32)
        elif name.endswith(("_scale", "norm.weight")):
            tensors[name] = torch.ones(shape)
        elif name.endswith(("_base", "attn_sink", ".ape", "gate.bias")):
            tensors[name] = torch.zeros(shape)
        else:
            std = 0.02 if "hc_" in name or "embed" in name else shape[-1] ** -0.5
            tensors[name] = torch.randn(shape, generator=gen) * std
    for name in [n for n in tensors if n.endswith("wo_b.weight") or n.endswith(".w2.weight")]:
        tensors[name] /= math.sqrt(2 * (ARGS.n_layers + 1))   # residual branches start small
    return tensors


def as_model(tensors: dict[str, torch.Tensor]) -> ModelParams:
    """The training view: dense tensors as they are, experts stacked (one rank holds all
    during training; serving splits them over the ranks at load)."""
    dense = {n: t for n, t in tensors.items() if ".experts." not in n}
    experts = {}
    for layer in range(ARGS.n_layers + ARGS.n_mtp_layers):
        prefix = ARGS.prefix(layer) + "ffn.experts."
        stack = {w: torch.stack([tensors[f"{prefix}{e}.{w}.weight"]
                                 for e in range(ARGS.n_experts)]) for w in ("w1", "w2", "w3")}
        experts[layer] = Experts.of(**stack)
    return ModelParams(ARGS, SPEC.architecture.FINGERPRINT, dense, experts,
                       Rope.build(ARGS, torch.device("cpu")), torch.float32,
                       torch.device("cpu"), ranks=1)


def trainable(tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [t for n, t in tensors.items()
            if t.is_floating_point() and not n.endswith("gate.bias")]


# -- training --------------------------------------------------------------------------


def fresh_view(batch: int) -> PoolView:
    """Pools for `batch` sequences on one rank: every sequence gets its own blocks."""
    groups = SPEC.pools.GROUPS
    per_seq = {g: grp.table_width for g, grp in groups.items()}
    blocks = {g: batch * n for g, n in per_seq.items()}
    shapes = {g: (len(grp.layers), blocks[g], grp.rows_per_page, grp.row_width)
              for g, grp in groups.items()}
    pools = {g: (torch.zeros(s),) for g, s in shapes.items()}
    tables = {g: torch.arange(blocks[g], dtype=torch.int32).view(1, batch, per_seq[g])
              for g in groups}
    return PoolView(pools, tables, groups)


def loss_of(params: ModelParams, batch: torch.Tensor, tile: int) -> tuple[torch.Tensor, ...]:
    """Next-token and MTP losses of a batch [B, L+1] of token windows."""
    b, n = batch.shape[0], batch.shape[1] - 1
    inputs = batch[:, :n].reshape(-1)
    segments = [Segment(0, i, 0, n, i * n) for i in range(b)]
    h = main_model(params, inputs, segments, fresh_view(b), tile)
    main = F.cross_entropy(logits(params, h), batch[:, 1:].reshape(-1))
    # MTP at position i: h(i) and token i+1 predict token i+2.
    hm = h.view(b, n, *h.shape[1:])[:, : n - 1].reshape(-1, *h.shape[1:])
    nxt = batch[:, 1:n].reshape(-1)
    mtp_segments = [Segment(0, i, 0, n - 1, i * (n - 1)) for i in range(b)]
    layer = ARGS.mtp_layers[0]
    out = mtp_block(params, layer, hm, nxt, mtp_segments, fresh_view(b), tile)
    mtp = F.cross_entropy(logits(params, out, ARGS.prefix(layer)), batch[:, 2:].reshape(-1))
    return main + MTP_WEIGHT * mtp, main, mtp


class LoadTracker:
    """Counts routed-expert picks of the non-hash layers for the bias update."""

    def __init__(self) -> None:
        self.counts: dict[int, torch.Tensor] = {}
        self._route = moe.route

    def __enter__(self) -> LoadTracker:
        def route(p, args, hashed, x, ids):
            chosen, weights = self._route(p, args, hashed, x, ids)
            if not hashed:
                key = id(p["ffn.gate.bias"])
                self.counts[key] = self.counts.get(key, 0) + torch.bincount(
                    chosen.reshape(-1), minlength=args.n_experts)
            return chosen, weights

        moe.route = route
        return self

    def __exit__(self, *exc) -> None:
        moe.route = self._route


def balance(tensors: dict[str, torch.Tensor], tracker: LoadTracker, rate: float) -> None:
    """Auxiliary-loss-free balancing: raise the bias of under-used experts."""
    for name, bias in tensors.items():
        if name.endswith("gate.bias") and id(bias) in tracker.counts:
            load = tracker.counts[id(bias)].float()
            bias += rate * torch.sign(load.mean() - load)
    tracker.counts.clear()


def batches(stream: torch.Tensor, size: int, length: int, rng: random.Random):
    while True:
        starts = [rng.randrange(0, len(stream) - length - 1) for _ in range(size)]
        yield torch.stack([stream[s: s + length + 1] for s in starts])


@torch.no_grad()
def evaluate(params: ModelParams, stream: torch.Tensor, length: int, windows: int,
             tile: int) -> tuple[float, float]:
    """Held-out perplexity of the main model and MTP loss on disjoint windows."""
    mains, mtps = [], []
    for i in range(windows):
        window = stream[i * length: i * length + length + 1]
        if len(window) < length + 1:
            break
        _, main, mtp = loss_of(params, window[None], tile)
        mains.append(float(main))
        mtps.append(float(mtp))
    return math.exp(sum(mains) / len(mains)), sum(mtps) / len(mtps)


# -- output ----------------------------------------------------------------------------


def save(tensors: dict[str, torch.Tensor], tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stored = {}
    for name, t in tensors.items():
        keep = not t.is_floating_point() or t.dim() == 1 or "hc_" in name \
            or name.endswith((".ape", "attn_sink"))
        stored[name] = t.detach().contiguous() if keep else t.detach().to(torch.bfloat16)
    save_file(stored, str(out / "model.safetensors"))
    config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
              "torch_dtype": "bfloat16", **{k: (list(v) if isinstance(v, tuple) else
                                                 dict(v) if isinstance(v, dict) else v)
                                             for k, v in SPEC.architecture.CONFIG.items()}}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "model_max_length": 16384,
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE},
        indent=2) + "\n")


def plot(points: list[tuple[int, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [p[0] for p in points]
    ax.plot(steps, [p[1] for p in points], label="next-token loss")
    ax.plot(steps, [p[2] for p in points], label="MTP loss (token i+2)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("tiny DeepSeek V4 on the Python standard library")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "tiny")
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-windows", type=int, default=0,
                        help="held-out 512-token windows to score (default 0: all of them; "
                             "bench/heldout.py also sets near-duplicates of training files "
                             "apart)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train_files, held_files = split(corpus_files())
    tok = train_tokenizer(train_files, ARGS.vocab_size)
    train, held = token_stream(tok, train_files), token_stream(tok, held_files)
    print(f"corpus: {len(train_files)} files, {len(train)} tokens; held out "
          f"{len(held_files)} files, {len(held)} tokens", flush=True)
    tensors = init_params(args.seed)
    for t in trainable(tensors):
        t.requires_grad_(True)
    params = as_model(tensors)
    opt = torch.optim.AdamW(trainable(tensors), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / args.steps))))
    points, start = [], time.time()
    data = batches(train, args.batch, args.seq, rng)
    for step in range(args.steps):
        params = as_model(tensors)      # experts are re-stacked from the live tensors
        with LoadTracker() as tracker:
            total, main, mtp = loss_of(params, next(data), SPEC.contract.TILE)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trainable(tensors), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            balance(tensors, tracker, 1e-3)
        points.append((step, main.item(), mtp.item()))
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {points[-1][1]:.3f}  mtp {points[-1][2]:.3f}  "
                  f"{time.time() - start:.0f}s", flush=True)
    params = as_model({n: t.detach() for n, t in tensors.items()})
    windows = args.eval_windows or (len(held) - 1) // args.seq
    ppl, mtp_loss = evaluate(params, held, args.seq, windows, SPEC.contract.TILE)
    save(tensors, tok, args.out)
    plot(points, args.out / "loss.png")
    summary = {"steps": args.steps, "batch": args.batch, "seq": args.seq,
               "train_tokens": len(train), "tokens_seen": args.steps * args.batch * args.seq,
               "final_loss": points[-1][1], "final_mtp_loss": points[-1][2],
               "heldout_perplexity": ppl, "heldout_mtp_loss": mtp_loss,
               "minutes": (time.time() - start) / 60, "python": sys.version.split()[0],
               "files": len(train_files), "heldout_files": len(held_files)}
    (args.out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
