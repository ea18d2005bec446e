"""Parity with transformers' DeepseekV4ForCausalLM on random weights of the tiny
architecture, exported in the official naming and loaded by our loader.

transformers' full (uncached) forward equals the official one to ~1e-5, so it is the
oracle here; the prompts run through our pools under several chunkings and then token
by token. The init is non-degenerate (8 index heads, random sinks, biases and hash
table with distinct experts) and the indexer's k-th/(k+1)-th score gap is checked, so
that top-k among ties cannot decide the result.
"""
from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

from contract.checkpoint_layout import expected_shapes
from contract.model_args import ModelArgs
from runtime.model import indexer
from runtime.weights.loader import load_params
from tests.model.support import REF, Driver, export_official, randomize

TOL = 1e-4
LENGTHS = [1, 4, 16, 127, 128, 129, 255, 256, 257, 300]
CONFIG = {k: (list(v) if isinstance(v, tuple) else v) for k, v in REF.architecture.CONFIG.items()}
CONFIG["rope_scaling"] = dict(CONFIG["rope_scaling"])


def _mtp_tensors(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    shapes = expected_shapes(ModelArgs.from_config(CONFIG))
    return {name: torch.randn(shape, generator=gen) * 0.05
            for name, shape in shapes.items() if name.startswith("mtp.")}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    config = DeepseekV4Config(**CONFIG)
    model = DeepseekV4ForCausalLM(config).float().eval()
    randomize(model, CONFIG, seed=0)
    out = export_official(model.state_dict(), CONFIG, tmp_path_factory.mktemp("ckpt"),
                          _mtp_tensors(seed=0))
    return model, load_params(out, REF)


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(2, CONFIG["vocab_size"], (max(LENGTHS),),
                         generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture
def gap_watch(monkeypatch):
    """Record the smallest relative gap between the k-th and (k+1)-th indexer score."""
    gaps = []
    select = indexer.select

    def watched(q, w, keys, qpos, ratio, topk):
        scale = q.shape[-1] ** -0.5
        scores = torch.relu(torch.einsum("thd,ed->the", q.float(), keys.float())) * scale
        scores = (scores * w.float().unsqueeze(-1)).sum(1)
        visible = (qpos + 1) // ratio
        for row, n in zip(scores, visible.tolist()):
            if n > topk:
                top = row[:n].topk(topk + 1).values
                gaps.append(float((top[-2] - top[-1]) / top[0].abs().clamp(min=1e-6)))
        return select(q, w, keys, qpos, ratio, topk)

    monkeypatch.setattr(indexer, "select", watched)
    return gaps


def _reference(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("length", LENGTHS)
def test_logits_match_under_every_chunking_and_decode(models, prompt, gap_watch, length):
    model, params = models
    ids = prompt[:length]
    want = _reference(model, ids)
    for chunk in (128, 256, 8192):
        got, _ = Driver(params).prefill(ids, chunk)
        assert (got - want).abs().max().item() <= TOL, f"chunk {chunk}"
    head = max(1, length - 4)
    driver = Driver(params, rank=5, row=2)
    rows = [driver.prefill(ids[:head], 8192)[0]]
    rows += [driver.prefill([tok], 1, start=head + i)[0] for i, tok in enumerate(ids[head:])]
    assert (torch.cat(rows) - want).abs().max().item() <= TOL, "token by token"
    assert not gap_watch or min(gap_watch) > 1e-5, "indexer top-k decided by a near tie"


def test_the_official_shared_expert_has_no_clamp():
    """transformers clamps the shared expert; the official code (and we) do not."""
    from runtime.model import moe

    x = torch.full((1, 4), 3.0)
    w1 = torch.full((2, 4), 2.0)   # gate pre-activation 24 > swiglu_limit 10
    w3 = torch.full((2, 4), 2.0)
    w2 = torch.ones((4, 2))
    p = {"ffn.shared_experts.w1.weight": w1, "ffn.shared_experts.w2.weight": w2,
         "ffn.shared_experts.w3.weight": w3}
    unclamped = torch.nn.functional.silu(torch.tensor(24.0)) * 24.0 * 2
    assert torch.allclose(moe.shared(p, x), torch.full((1, 4), float(unclamped)))
    clamped = moe.swiglu(x, w1, w2, w3, limit=10.0)
    assert clamped[0, 0] < unclamped / 2
