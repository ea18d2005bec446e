"""Peak host memory of `v4serve generate` on a multi-GB checkpoint, against what it must
hold: the loaded weights and the cache pools, plus at most 1 GiB.

The checkpoint is a slice of V4-Flash (its widths, vocabulary and attention; 4 layers +
MTP, 8 routed experts), random, written as the release stores it: FP8 projections,
FP4 routed experts, bf16 embedding/head/norms, one file per layer. A scratch copy of the
repository gets its spec (`v4serve spec new` on the tiny base, which reads FP8/FP4 from
the checkpoint's headers; bfloat16; then `v4serve codegen`), and `v4serve generate` runs
there twice: weights held as released, and dequantized at load (weights.format:
bfloat16). The peak is the generate process's
maximum resident set (getrusage of the child).

    .venv/bin/python bench/load_memory.py [--workdir DIR] [--keep]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from bench.quantize import quantize  # noqa: E402
from contract.checkpoint_layout import expected_shapes  # noqa: E402
from contract.model_args import ModelArgs  # noqa: E402

GIB = 2**30
FLASH_KEYS = ("vocab_size", "hidden_size", "moe_intermediate_size", "num_attention_heads",
              "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups",
              "index_head_dim", "index_n_heads", "index_topk", "sliding_window")
SOURCES = ("codegen", "generated", "runtime", "server", "specs", "bench")


def slice_config() -> dict:
    """V4-Flash's config (from its spec) cut to 4 layers + MTP and 8 routed experts."""
    from codegen.pipeline import load_spec

    flash = load_spec(ROOT / "specs" / "deepseek-v4-flash.yaml").model.model_dump(mode="json")
    config = json.loads((ROOT / "tests" / "fixtures" / "v4-tiny" / "config.json").read_text())
    config.update({k: flash[k] for k in FLASH_KEYS})
    config.update(num_hidden_layers=4, num_hash_layers=1, compress_ratios=[0, 4, 128, 4, 0],
                  n_routed_experts=8, num_experts_per_tok=2, rope_scaling=flash["rope_scaling"],
                  max_position_embeddings=flash["max_position_embeddings"])
    return config


def write_checkpoint(config: dict, out: Path) -> None:
    """Random weights of `config`, quantized as released, one file per layer; config.json
    last (its presence says the checkpoint is whole)."""
    args = ModelArgs.from_config(config)
    gen = torch.Generator().manual_seed(0)
    files: dict[str, dict[str, torch.Tensor]] = {}
    for name, shape in expected_shapes(args).items():
        layered = name.startswith(("layers.", "mtp."))
        stem = "-".join(name.split(".")[:2]) if layered else "model"
        files.setdefault(stem, {})[name] = shape
    out.mkdir(parents=True, exist_ok=True)
    for stem, shapes in files.items():
        tensors: dict[str, torch.Tensor] = {}
        for name, shape in shapes.items():
            tensors.update(quantize(name, _random(name, shape, args, gen)))
        save_file(tensors, str(out / f"{stem}.safetensors"))
    for extra in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "models" / "tiny" / extra, out / extra)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _random(name: str, shape: tuple[int, ...], args: ModelArgs,
            gen: torch.Generator) -> torch.Tensor:
    if name.endswith("tid2eid"):
        return torch.randint(0, args.n_experts, shape, generator=gen, dtype=torch.int32)
    if len(shape) == 1:
        fill = torch.ones if name.endswith("norm.weight") else torch.zeros
        return fill(shape, dtype=torch.bfloat16)
    scale = shape[-1] ** -0.5
    return (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16)


def scratch_repo(workdir: Path) -> Path:
    """A copy of the sources with the slice's spec generated, weights as released and
    a dequantize-at-load twin."""
    repo = workdir / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, repo / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    spec = repo / "specs" / "flash-slice.yaml"
    _v4serve(repo, "spec", "new", "--from-config", str(workdir / "ckpt" / "config.json"),
             "--base", "specs/tiny.yaml", "-o", str(spec), check=False)
    # the tiny base's smallest context bucket holds fewer CSA entries than index_topk 512
    text = re.sub(r"(context_buckets:\s*\[?\s*-?\s*)1024\b", r"\g<1>2048", spec.read_text())
    text = text.replace("dtype: float32\n  backend", "dtype: bfloat16\n  backend")
    assert "dense: fp8\n  experts: fp4" in text        # spec new read the headers
    spec.write_text(text)
    (repo / "specs" / "flash-slice-bf16.yaml").write_text(
        text.replace("format: as_released", "format: bfloat16"))
    _v4serve(repo, "codegen", "specs/flash-slice.yaml", "specs/flash-slice-bf16.yaml")
    return repo


def _v4serve(repo: Path, *argv: str, check: bool = True) -> tuple[str, int]:
    """Run `v4serve argv` in the scratch repository: (its stdout, its peak RSS bytes)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "server.cli", *argv], cwd=repo,
                                stdout=out, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(repo)})
        _, status, usage = os.wait4(proc.pid, 0)       # this child's own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if proc.returncode and check:
            raise SystemExit(f"v4serve {' '.join(argv)} failed:\n{err.read()}")
        return out.read(), usage.ru_maxrss * 1024            # Linux: KiB


def generate(repo: Path, spec: str, checkpoint: Path) -> dict:
    """`v4serve generate` on the checkpoint: its JSON summary and its peak RSS."""
    start = time.perf_counter()
    out, peak = _v4serve(repo, "generate", "--spec", spec, "--model", str(checkpoint),
                         "--prompt", "def load(path):", "--max-tokens", "8", "--json",
                         "--max-num-seqs", "8", "--max-model-len", "4096", "--enforce-eager",
                         "--num-speculative-tokens", "0")
    summary = json.loads(out.strip().splitlines()[-1])
    return {"peak_rss": peak, "seconds": time.perf_counter() - start, **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch folder (default: a temporary one, removed after)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="v4serve-load-"))
    try:
        config = slice_config()
        start = time.perf_counter()
        ckpt = workdir / "ckpt"
        done = ckpt / "config.json"          # a kept --workdir: its checkpoint is reused
        if not done.exists() or json.loads(done.read_text()) != config:
            write_checkpoint(config, ckpt)
        disk = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
        print(f"checkpoint: {disk / GIB:.2f} GiB on disk (V4-Flash widths, 4 layers + MTP, "
              f"8 experts; ready in {time.perf_counter() - start:.0f} s)")
        repo = scratch_repo(workdir)
        print("| weights | on device | pools | peak RSS | bound (weights + pools + 1 GiB) "
              "| margin | load + generate |")
        print("|---|---|---|---|---|---|---|")
        for spec in ("flash-slice", "flash-slice-bf16"):
            r = generate(repo, spec, workdir / "ckpt")
            weights, pools = r["resident_weight_bytes"], r["resident_pool_bytes"]
            bound = weights + pools + GIB
            label = "as released" if spec == "flash-slice" else "dequantized at load (bf16)"
            print(f"| {label} | {weights / GIB:.2f} GiB | {pools / GIB:.2f} GiB | "
                  f"{r['peak_rss'] / GIB:.2f} GiB | {bound / GIB:.2f} GiB | "
                  f"{(bound - r['peak_rss']) / GIB:+.2f} GiB | {r['seconds']:.0f} s |")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
