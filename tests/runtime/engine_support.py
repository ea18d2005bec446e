"""Engines over the reference checkpoint, and greedy runs without the scheduler."""
from __future__ import annotations

import torch

from runtime.core.config import EngineConfig
from runtime.core.sampling_params import SamplingParams
from runtime.engine.engine import Engine
from runtime.model.forward import logits, main_model
from runtime.model.paging import Segment
from runtime.text.detokenizer import Detokenizer
from runtime.text.tokenizer import Tokenizer
from tests.model.support import FIXTURE, REF, Driver

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def make_engine(params, outputs: bool = True, spec=REF, **overrides) -> Engine:
    config = EngineConfig(spec="reference", model=FIXTURE, **overrides)
    return Engine(config, spec, params, Tokenizer(FIXTURE), outputs=outputs)


def random_prompt(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, 512, (length,), generator=gen).tolist()


def greedy_without_scheduler(params, prompt: list[int], max_tokens: int,
                             spec=REF) -> list[int]:
    """The whole prompt in one pass, then one token per pass: no scheduler, no kernels."""
    driver = Driver(params, spec=spec)
    out, _ = driver.prefill(prompt, 8192)
    tokens = [int(out[-1].argmax())]
    while len(tokens) < max_tokens:
        seg = Segment(0, 0, len(prompt) + len(tokens) - 1, 1, 0)
        with torch.inference_mode():
            h = main_model(params, torch.tensor(tokens[-1:]), [seg], driver.view(), 128)
            tokens.append(int(logits(params, h)[-1].argmax()))
    return tokens


def assert_all_free(engine: Engine) -> None:
    """Every block of every group on every rank, and every MTP slot, is free again."""
    pool = engine.scheduler.pool
    for rank in range(pool.ranks):
        for group, total in pool.capacity.items():
            assert pool.free_count(rank, group) == total, (rank, group)
        if engine.scheduler.slots is not None:
            assert engine.scheduler.slots.in_use(rank) == 0, rank
    assert not engine.requests and engine.scheduler.num_running == 0


FAULT = "<fault>"       # the stop string that marks a request whose detokenizer raises


def break_detokenizer(monkeypatch) -> None:
    """Detokenizer.add raises UnicodeError for a request with the stop string FAULT."""
    real = Detokenizer.add

    def patched(self, ids):
        if FAULT in self.stop:
            raise UnicodeError("injected detokenizer fault")
        return real(self, ids)

    monkeypatch.setattr(Detokenizer, "add", patched)
