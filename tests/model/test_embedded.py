"""The embedded model (models/tiny) is an ordinary checkpoint: it loads through the normal
loader for the tiny spec, runs the parity path, and serves losslessly with its own MTP."""
from __future__ import annotations

import pytest
import torch

import generated
from runtime.core.config import EngineConfig
from runtime.core.sampling_params import SamplingParams
from runtime.engine.engine import Engine
from runtime.text.tokenizer import Tokenizer
from runtime.weights.loader import load_params
from tests.conftest import REPO
from tests.model.support import Driver, load_transformers

pytestmark = pytest.mark.slow

MODEL = REPO / "models" / "tiny"
TINY = generated.load("tiny")
CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()
'''


@pytest.fixture(scope="module")
def params():
    return load_params(MODEL, TINY)


@pytest.fixture(scope="module")
def prompt():
    ids = Tokenizer(MODEL).encode(CODE * 3)
    assert len(ids) > 260       # several HCA entries, many CSA entries
    return ids[:300]


def test_loads_for_the_tiny_spec(params):
    assert params.fingerprint == TINY.architecture.FINGERPRINT
    assert params.args.vocab_size == Tokenizer(MODEL).vocab_size


def test_logits_agree_across_chunkings_and_with_transformers(params, prompt):
    whole, _ = Driver(params, spec=TINY).prefill(prompt, 8192)
    for chunk in (128, 256):
        got, _ = Driver(params, spec=TINY).prefill(prompt, chunk)
        assert (got - whole).abs().max() <= 1e-4
    with torch.inference_mode():
        want = load_transformers(MODEL)(torch.tensor([prompt])).logits[0]
    assert (whole - want).abs().max() <= 1e-3


def _engine(params, k: int, backend: str = "compiled-eager", **config) -> Engine:
    config = EngineConfig(spec="tiny", model=MODEL, num_speculative_tokens=k, backend=backend,
                          **config)
    return Engine(config, TINY, params, Tokenizer(MODEL))


def test_greedy_output_is_the_same_with_and_without_mtp(params):
    greedy = SamplingParams(temperature=0, max_tokens=48)
    prompts = ["def fibonacci(n):", "import os\n\n\ndef main():", "class Stack:\n    def"]
    outputs = {}
    for k in (0, 1):
        engine = _engine(params, k)
        outputs[k] = [o.output_ids for o in engine.generate(prompts, greedy)]
        if k:
            assert engine.stats.accepted_tokens > 0
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("k", [0, 1])
def test_both_backends_give_the_same_greedy_code(params, k):
    """bench/code_prompts.txt, greedy, through the torch backend and the compiled one's
    graphs: identical, but where the two top logits are closer than the backends' float
    difference (1e-4), which the check below allows and verifies."""
    import json

    lines = (REPO / "bench" / "code_prompts.txt").read_text().splitlines()
    prompts = [Tokenizer(MODEL).encode(json.loads(line)) for line in lines if line.strip()]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    torch_out = _engine(params, k, "torch").generate(prompts, greedy)
    compiled = _engine(params, k).generate(prompts, greedy)
    for prompt, a, b in zip(prompts, torch_out, compiled):
        if a.output_ids == b.output_ids:
            continue
        at = next(i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y)
        logits, _ = Driver(params, spec=TINY).prefill(prompt + a.output_ids[:at], 8192)
        top2 = logits[-1].topk(2).values
        assert float(top2[0] - top2[1]) < 1e-4, (prompt, at)
