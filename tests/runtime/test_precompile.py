"""`v4serve compile` and the background compile: which graphs they compile."""
from __future__ import annotations

import dataclasses

from runtime.core.config import EngineConfig
from runtime.process import precompile


class Recorded:
    """An engine that records the K it was built for and what became of it."""

    built: list = []

    def __init__(self, config):
        self.config = config

    @classmethod
    def build(cls, config):
        cls.built.append(config.num_speculative_tokens)
        return cls(config)

    def warmup(self):
        return {f"graph K={self.config.num_speculative_tokens}": 1.0}

    def close(self):
        Recorded.built.append("closed")


def test_without_a_k_every_k_the_spec_declares_is_compiled(monkeypatch):
    monkeypatch.setattr(precompile, "Engine", Recorded)
    Recorded.built = []
    seconds = precompile.compile_all(EngineConfig(spec="tiny"))
    assert Recorded.built == [0, "closed", 1, "closed", 2, "closed", 3, "closed"]   # tiny's
    assert set(seconds) == {f"graph K={k}" for k in range(4)}
    Recorded.built = []
    precompile.compile_all(EngineConfig(spec="tiny", num_speculative_tokens=0))
    assert Recorded.built == [0, "closed"]


def test_the_command_names_the_executor_and_the_engines_k():
    config = EngineConfig(spec="tiny", model="m", distributed_executor_backend="mp")
    command = precompile.precompile_command(config)
    assert command[command.index("--distributed-executor-backend") + 1] == "mp"
    assert "--num-speculative-tokens" not in command                  # every K
    command = precompile.precompile_command(config, k=0)           # a serving engine's own
    assert command[command.index("--num-speculative-tokens") + 1] == "0"
    named = dataclasses.replace(config, num_speculative_tokens=1)
    command = precompile.precompile_command(named)
    assert command[command.index("--num-speculative-tokens") + 1] == "1"
