"""What an engine is built from: the spec, the checkpoint, the limits in force (the
spec's, lowered), memory, backend and executor. Torch-free: the API server, `v4serve
plan` and the engine core process share it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineConfig:
    spec: str = "tiny"
    model: str | Path = "models/tiny"
    num_speculative_tokens: int | None = None     # None: the spec's default
    # "fixed": K drafts every step; "adaptive": per step, K in 0..num_speculative_tokens
    # (runtime/core/speculation.py)
    speculative_policy: str = "fixed"
    max_num_batched_tokens: int | None = None     # None: the spec's limit (per rank per step)
    long_prefill_token_threshold: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    prefix_affinity_threshold: int = 4    # running requests a cached prefix may outweigh
    # while every slot is taken, a body with nothing running preempts a row of the body
    # running the most beyond its share (runtime/core/scheduler.py's _share_slots)
    fair_share_preemption: bool = True
    kv_cache_memory: int | None = None            # pool bytes per rank; overrides the plan
    # bytes of one rank's device: the pools take what the weights and a workspace leave of
    # device_memory x gpu_memory_utilization (runtime/planning/memory_plan.py); None: pools sized
    # by kv_cache_memory, else enough for the limits
    device_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    # V4.1's Engram tables (vLLM's --engram-config): "device" sharded across the ranks'
    # device memory by row range; "host" one copy per node in host shared memory, each
    # step reading its rows (runtime/planning/engram_tables.py). No effect without Engram.
    engram_placement: str = "host"
    device: str | None = None                     # None: the spec's device
    backend: str | None = None
    max_logprobs: int = 20                        # most top log-probs a request may ask for
    max_stop_strings: int = 64                    # most stop strings of a request
    max_stop_token_ids: int = 1024                # most stop token ids of a request
    enforce_eager: bool = False                   # never compile (vLLM's --enforce-eager)
    defer_compile: bool = False                   # uncompiled graphs run eagerly meanwhile
    detokenize: bool = True     # text and stop strings here (off: the API server does them)
    # ranks as processes (vLLM's --distributed-executor-backend): "uni" runs every rank in
    # this process; "mp" one worker process per rank in a torch.distributed group
    distributed_executor_backend: str = "uni"
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0                          # 0: a free port (one node only)
    distributed_timeout: float = 300.0            # seconds a collective may wait
    worker_threads: int | None = None             # torch threads per rank worker on cpu
