"""The engine: one step is schedule -> run -> commit -> outputs.

    engine = Engine.build(EngineConfig(spec="tiny", model="models/tiny"))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        for output in engine.step(): ...

`runtime.engine.async_engine.AsyncEngine` drives the same loop from a thread for the server.
An engine core process (runtime/process/engine_core.py) builds its engine without
outputs and sends `step_deltas()`, the step as ids: its client makes the outputs.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import generated
from contract.v41_config import is_v41
from runtime.backends import get_backend
from runtime.core.config import EngineConfig
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import SchedulerOutput
from runtime.device.model_runner import ModelRunner
from runtime.device.step_result import StepResult
from runtime.engine.output_processor import Delta, OutputProcessor, RequestOutput
from runtime.executor.executor import Executor, backend_name
from runtime.executor.workers import Workers
from runtime.planning import plan_report
from runtime.planning.admission import Admission, ConfigError
from runtime.text.tokenizer import Tokenizer, eos_token_id
from runtime.weights.loader import bytes_per_rank, load_params

if TYPE_CHECKING:
    from runtime.backends.compiled.graphs import Graphs

log = logging.getLogger("v4serve.engine")


@dataclass
class Stats:
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    # per draft position j: drafts kept there (vLLM's ..._num_accepted_tokens_per_pos)
    accepted_per_position: list[int] = field(default_factory=list)
    decode_steps_by_k: Counter[int] = field(default_factory=Counter)   # the K each chose
    twin_steps: int = 0           # K=0 steps of the kernel that keeps the MTP slots
    schedule_seconds: float = 0.0
    requests_finished: int = 0


class Engine:
    def __init__(self, config: EngineConfig, spec, params, tokenizer: Tokenizer | None,
                 outputs: bool = True):
        self.config, self.spec, self.params, self.tokenizer = config, spec, params, tokenizer
        _check_launched(config, spec)
        self.admission = Admission.plan(config, spec)
        self.k, self.limits, self.capacity = (self.admission.k, self.admission.limits,
                                              self.admission.capacity)
        self.scheduler = self.admission.scheduler()
        device = torch.device(config.device or spec.contract.DEVICE)
        self.backend = backend_name(config, spec)
        self.executor: Executor = self._executor(device)
        self.stats = Stats()
        self.requests: dict[str, Request] = {}
        self._preparing: dict[Request, Future] = {}     # grammars compiling, not scheduled
        # text, stop strings and outputs, from add to a request's last output (None: an
        # engine core's, whose client makes them from the deltas)
        self.output_processor = OutputProcessor(tokenizer if config.detokenize else None) \
            if outputs else None
        self._ids = itertools.count()
        self._arrival = itertools.count()

    def _executor(self, device: torch.device) -> Executor:
        """Rank worker processes (mp: each rank checks its own weights), or every rank
        in this process (uni)."""
        config, spec = self.config, self.spec
        if config.distributed_executor_backend == "mp":
            return Workers(config, spec.contract)
        self.admission.check_weights(bytes_per_rank(self.params))
        if self.admission.memory and spec.contract.RANKS > 1 and device.type != "cpu":
            log.warning("--device-memory is one rank's; with the uni executor all %d "
                        "ranks share %s, which needs about %d times the plan",
                        spec.contract.RANKS, device, spec.contract.RANKS)
        return ModelRunner(spec, self.params, self.capacity.blocks, self.k, self.backend,
                           device, max_logprobs=config.max_logprobs,
                           checkpoint=Path(config.model), defer_compile=config.defer_compile,
                           adaptive=self.admission.adaptive)

    def warmup(self) -> dict[str, float]:
        """Compile (or load from the cache) every graph of a compiling backend before
        the first request; returns seconds per graph (empty for an eager backend). With
        defer_compile, graphs not compiled yet stay eager (see pending_graphs)."""
        if not self.executor.compiles():
            return {}               # nothing to compile here: an eager backend (or
        self.executor.warmup()        # --enforce-eager), or rank workers that warm up alone
        graphs = self.graphs
        return dict(graphs.seconds) if graphs is not None else {}

    @property
    def graphs(self) -> Graphs | None:
        """The compiled backend's graphs (None for a backend that compiles nothing here)."""
        return self.executor.graphs()

    def pending_graphs(self) -> int:
        """Graphs that run eagerly until a compile saves them (defer_compile)."""
        return self.executor.pending_graphs()

    def summary(self) -> dict:
        """What was loaded and how much fits: the startup log and /server_info show it."""
        c, cap, limits = self.spec.contract, self.capacity, self.limits
        return {
            "spec": self.spec.SPEC_NAME, "spec_path": self.spec.SPEC_PATH,
            "checkpoint": str(self.config.model), "backend": self.backend,
            "executor": self.config.distributed_executor_backend,
            "device": str(self.executor.device), "ranks": c.RANKS,
            # per rank process: rank, pid, host, device, param_bytes, pool_bytes (mp)
            "processes": self.executor.rank_processes(),
            "param_bytes_per_rank": self.executor.param_bytes_per_rank(),
            "pool_tokens_per_rank": cap.tokens, "pool_bytes_per_rank": cap.bytes,
            "max_model_len": limits.max_model_len,
            # requests of max_model_len tokens that run at once, over all ranks
            "max_concurrency": self.admission.concurrency(),
            # `v4serve plan`'s figures for this configuration
            "plan": plan_report.report(self.admission),
        }

    def resident(self) -> dict:
        """Device bytes this process holds: its weights and its pools (every rank with
        `uni`; the rank processes hold theirs with `mp`)."""
        return self.executor.resident()

    def graph_info(self) -> dict:
        """The compiled backend's graphs: seconds each took to compile or load, and how
        many still run eagerly while a background compile finishes them."""
        graphs = self.graphs
        if graphs is None:
            return {"mode": "eager", "compiled": {}, "pending": 0}
        return {"mode": graphs.mode, "pending": graphs.pending(),
                "compiled": {key: round(sec, 3) for key, sec in graphs.seconds.items()}}

    def snapshot(self) -> dict:
        """Counters and gauges for /metrics, as plain data (a separate engine core sends
        it with each step's outputs)."""
        s, sched = self.stats, self.scheduler
        pool = sched.pool
        return {
            "running": sched.num_running,
            "waiting": len(sched.waiting) + len(self._preparing),   # grammars compiling too
            "kv_usage": max((pool.usage(r) for r in range(pool.ranks)), default=0.0),
            "pool_usage": {f"{group}/{rank}": pool.used(rank, group) / total if total else 0.0
                           for rank in range(pool.ranks)
                           for group, total in pool.capacity.items()},
            "prompt_tokens": s.prompt_tokens, "generation_tokens": s.generation_tokens,
            "preemptions": sched.num_preemptions, "drafts": s.drafts,
            "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
            "accepted_per_position": list(s.accepted_per_position),
            "decode_steps_by_k": {str(k): n for k, n in sorted(s.decode_steps_by_k.items())},
            "twin_steps": s.twin_steps,
            "dispatches": dict(self.dispatches), "graphs": self.graph_info(),
            "prefix_cache": self.prefix_cache_info(),
        }

    def prefix_cache_info(self) -> dict:
        """Prompt tokens looked up and found in the prefix cache (vLLM's counters), and
        per rank the hit rate and the cached blocks."""
        sched = self.scheduler
        stats, pool = sched.cache_stats, sched.pool
        return {
            "enabled": sched.layout is not None,
            "queries": sum(stats.queries), "hits": sum(stats.hits),
            "ranks": [{"queries": q, "hits": h, "hit_rate": round(h / q, 4) if q else 0.0,
                       "cached_blocks": pool.cached_blocks(rank),
                       "evictions": pool.evictions[rank]}
                      for rank, (q, h) in enumerate(zip(stats.queries, stats.hits))],
        }

    def close(self) -> None:
        """Stop the executor: its rank workers (mp), or its grammar thread."""
        self.executor.close()

    @classmethod
    def build(cls, config: EngineConfig, outputs: bool = True) -> Engine:
        spec = generated.load(config.spec)
        device = config.device or spec.contract.DEVICE
        _check_launched(config, spec)
        _check_executor(config, spec)
        params = None if config.distributed_executor_backend == "mp" \
            else load_params(config.model, spec, device=device)   # mp: each rank its own
        tokenizer_path = Path(config.model) / "tokenizer.json"
        tokenizer = Tokenizer(config.model) if tokenizer_path.exists() else None
        return cls(config, spec, params, tokenizer, outputs)

    # -- requests --------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None, group: str | None = None) -> Request:
        """Queue a request; ValueError (InvalidParam naming the field where one is at
        fault) says why it can never run. `group`: the HTTP body it came from (its
        prompts x n share one); admission takes turns between groups, so one body's many
        requests do not hold another's first token (None: a group of its own)."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.admission.check(ids, params)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        eos = eos_token_id(self.tokenizer, self.spec.architecture.CONFIG)
        request = Request(request_id, ids, params, next(self._arrival), eos, group)
        if self.output_processor is not None:
            self.output_processor.add(request_id, ids, params.stop)
        try:
            if params.structured is None:
                self.scheduler.add(request)           # the last step that may refuse it
            else:
                self._prepare(request)
        except BaseException:
            self._forget_output(request_id)
            raise
        self.requests[request_id] = request
        return request

    def _prepare(self, request: Request) -> None:
        """A constrained request: scheduled once its grammar is compiled, off the step
        (ValueError, as scheduler.add, if it could never run)."""
        reason = self.scheduler.check(request)
        if reason:
            raise ValueError(reason)
        self._preparing[request] = self.executor.prepare(request.params.structured)

    def validate(self, ids: list[int], params: SamplingParams) -> None:
        """InvalidParam if a request of these ids and params could never run here."""
        self.admission.validate(ids, params)

    @property
    def vocab_size(self) -> int:
        return self.spec.architecture.CONFIG["vocab_size"]

    def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is not None and not request.finished:
            compiling = self._preparing.pop(request, None)
            if compiling is not None:
                compiling.cancel()            # if it has not started
            self.scheduler.finish(request, "abort")
            self._forget(request)
            self._forget_output(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self._preparing)

    # -- the step --------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step: an output for each request it advanced or ended (its text too,
        with a tokenizer)."""
        if self.output_processor is None:
            raise RuntimeError("this engine makes no outputs (an engine core's, built with "
                               "outputs=False): step_deltas() is its step")
        outputs = self.output_processor.process(self.step_deltas())
        for output in outputs:
            request = self.requests.get(output.request_id)
            if output.finished and request is not None:     # the processor ended it
                self._end(request, output)
        return outputs

    def step_deltas(self) -> list[Delta]:
        """One step as ids: a Delta for each request it advanced or ended (an engine
        core sends these). A request that ended here has left the engine."""
        failed = self._prepared()
        if not self.scheduler.has_work():         # only grammars compiling
            return failed
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.stats.schedule_seconds += t1 - t0
        results = self.executor.execute(out)
        seconds = time.perf_counter() - t1
        deltas = failed + self._commit(out, results)
        if out.prefill:
            self.scheduler.speculation.prefilled()
        if out.decode:
            self._observe(out, results, None if out.prefill else seconds)
        return deltas

    def _prepared(self) -> list[Delta]:
        """Schedule the requests whose grammar compiled (waiting a moment for one when
        there is nothing else to do); a grammar that failed fails its request."""
        if not self._preparing:
            return []
        if not self.scheduler.has_work():
            wait(list(self._preparing.values()), timeout=0.05, return_when=FIRST_COMPLETED)
        failed = []
        for request, compiling in list(self._preparing.items()):
            if not compiling.done():
                continue
            del self._preparing[request]
            if compiling.exception() is None:
                self.executor.adopt(request, compiling.result())
                self.scheduler.add(request)
            else:
                failed.append(self._fail(request, compiling.exception()))
        return failed

    def _commit(self, out: SchedulerOutput, results: dict[Request, StepResult]) -> list[Delta]:
        """Commit what the step produced. A request whose share of the step failed (its
        sampling, its grammar) ends alone with an error; the others go on."""
        self.stats.steps += 1
        self.stats.prompt_tokens += sum(ch.length for ch in out.prefill)
        failed = [self._fail(r, res.error) for r, res in results.items() if res.error]
        kept = self.scheduler.commit(out, {r: res.tokens for r, res in results.items()
                                           if not res.error})
        deltas = []
        for request, tokens in kept.items():
            result = results[request]
            if result.drafted:
                self._count_drafts(request, result)
            deltas.append(_delta(request, tokens, result))
            if request.finished:
                self._forget(request)
        self.stats.generation_tokens += sum(map(len, kept.values()))
        return failed + deltas

    def _end(self, request: Request, output: RequestOutput) -> None:
        """A request the output processor ended (a stop string; its text failed) ends in
        the scheduler, with the output's reason."""
        self.scheduler.finish(request, output.finish_reason, output.stop_reason)
        self._forget(request)

    def _fail(self, request: Request, error: Exception) -> Delta:
        """End a request whose own processing raised; free what it holds."""
        self.scheduler.finish(request, "error")
        why = f"{type(error).__name__}: {error}"
        log.error("request %s failed: %s", request.request_id, why, exc_info=error)
        self._forget(request)
        return Delta(request.request_id, [], True, "error", error=why,
                     num_cached_tokens=request.num_cached_tokens)

    def _observe(self, out: SchedulerOutput, results: dict[Request, StepResult],
                 seconds: float | None) -> None:
        """Tell the speculation policy what a decode step cost (`seconds`: None when it
        also prefilled) and how many drafts each of its rows kept (at K=0: none, and
        whether the kernel that keeps the MTP slots ran)."""
        k = self.k if out.k is None else out.k
        rows = [r for launch in out.decode for r in launch]
        drafts = [(r.acceptance, results[r].accepted) for r in rows
                  if r in results and results[r].drafted == k]
        twin = not k and out.keep_slots and self.admission.adaptive
        self.stats.decode_steps_by_k[k] += 1
        self.stats.twin_steps += twin
        per_position = self.stats.accepted_per_position
        per_position.extend([0] * (k - len(per_position)))
        for _, accepted in drafts:
            for j in range(accepted):
                per_position[j] += 1
        self.scheduler.speculation.observe(k, len(rows), seconds, drafts, twin)

    def _count_drafts(self, request: Request, result: StepResult) -> None:
        request.draft_tokens += result.drafted
        request.accepted_tokens += result.accepted
        self.stats.drafts += 1
        self.stats.draft_tokens += result.drafted
        self.stats.accepted_tokens += result.accepted

    def _forget(self, request: Request) -> None:
        """A request that ended leaves the engine (its output, if any, is still made)."""
        self.stats.requests_finished += 1
        self.executor.forget(request.request_id)
        self.requests.pop(request.request_id, None)

    def _forget_output(self, request_id: str) -> None:
        if self.output_processor is not None:
            self.output_processor.forget(request_id)

    # -- offline use -----------------------------------------------------------------

    def generate(self, prompts: list[str | list[int]],
                 params: SamplingParams) -> list[RequestOutput]:
        """Run prompts to completion with continuous batching; outputs in prompt order."""
        ids = [self.add_request(p, params).request_id for p in prompts]
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for output in self.step():
                if output.finished:
                    final[output.request_id] = output
        return [final[i] for i in ids]

    @property
    def dispatches(self) -> Counter[str]:
        return self.executor.dispatches


def _delta(request: Request, tokens: list[int], result: StepResult) -> Delta:
    """What the step kept of a request's tokens, and the scheduler's finish, as ids."""
    return Delta(request.request_id, tokens, request.finished, request.finish_reason,
                 request.stop_reason, result.logprobs[: len(tokens)] if result.logprobs
                 else [], num_cached_tokens=request.num_cached_tokens)


# The backends that run a DeepSeek V4.1 package's kernels (dryrun computes nothing).
V41_BACKENDS = ("torch", "dryrun")


def _check_launched(config: EngineConfig, spec) -> None:
    """A DeepSeek V4.1 package launches its main prefill and K=0 decode on the torch
    backend only (its contract.py says so where its spec asks otherwise): a K > 0 or
    another backend is refused here, before the weights load."""
    if not is_v41(spec.architecture.CONFIG):
        return
    k, backend = config.num_speculative_tokens, backend_name(config, spec)
    if k:
        raise ConfigError(f"--num-speculative-tokens {k}: spec {spec.SPEC_PATH} is DeepSeek "
                          "V4.1, whose DSpark drafts are not launched yet (issue 58); it "
                          "decodes at K = 0 only")
    if backend not in V41_BACKENDS:
        raise ConfigError(f"backend {backend!r}: spec {spec.SPEC_PATH} is DeepSeek V4.1, "
                          "whose kernels run on the torch backend only (the compiled "
                          "backend's graphs implement DeepSeek V4)")


def _check_executor(config: EngineConfig, spec) -> None:
    executor = config.distributed_executor_backend
    if executor not in ("uni", "mp"):
        raise ConfigError(f"--distributed-executor-backend {executor!r}: one of uni, mp")
    backend = backend_name(config, spec)
    if executor == "mp" and not get_backend(backend).distributed:
        raise ConfigError("--distributed-executor-backend mp needs a backend whose MoE "
                          "spans rank processes (the compiled one, or eagerly with "
                          f"--enforce-eager); the {backend!r} backend runs in one process "
                          "only")
    if executor == "uni" and config.nnodes > 1:
        raise ConfigError("--nnodes > 1 needs --distributed-executor-backend mp")
