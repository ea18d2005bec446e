"""Admission: what decides, without the model, whether a request can ever run: the K and
limits in force (the spec's, lowered by the command line), the pool capacity, and the
checks on a request's token ids and parameters. Torch-free. The engine plans one; the API
server in front of a separate engine core plans the same one, so it refuses with a 400
exactly what the core would refuse."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from runtime.core.block_pool import BlockPool
from runtime.core.mtp_slots import SlotTable
from runtime.core.prefix_cache import Layout, Unsupported
from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.core.scheduler import Scheduler, SchedulerConfig, refusal
from runtime.core.speculation import POLICIES, Speculation, step_ks
from runtime.core.speculation import make as make_speculation
from runtime.planning import capacity
from runtime.planning.engram_tables import DEFAULT_PLACEMENT, PLACEMENTS
from runtime.planning.memory_plan import MemoryPlan

MAX_K = 3          # draft tokens per step this runtime verifies (the MTP layer, recursively)


def servable_ks(contract) -> list[int]:
    """The K of every decode layout a spec declares that this runtime serves."""
    return sorted(k for k in contract.DECODE_LAYOUTS if k <= MAX_K)


# The longest stop string: every token's text is searched for each one, and the last
# len(longest) - 1 characters of an output are held back until it cannot match.
MAX_STOP_CHARS = 1024


class ConfigError(ValueError):
    """A configuration the spec cannot serve; the message names the flag and the spec."""


@dataclass
class Admission:
    spec: ModuleType
    k: int
    limits: SchedulerConfig
    capacity: capacity.Capacity
    max_logprobs: int
    max_stop_strings: int = 64
    max_stop_token_ids: int = 1024
    layout: Layout | None = None              # prefix caching; None: off
    memory: MemoryPlan | None = None          # pools sized from a device's memory
    policy: str = "fixed"                     # --speculative-policy
    engram_placement: str = DEFAULT_PLACEMENT  # --engram-placement (V4.1's tables)

    @classmethod
    def plan(cls, config: Any, spec: ModuleType, ranks: int | None = None) -> Admission:
        """The admission of an EngineConfig on a generated spec; ConfigError if the spec
        cannot serve it. `ranks` plans its memory on another rank count (the routed
        experts split over them: `v4serve plan --ranks`)."""
        k, limits = _resolve(config, spec)
        running_per_rank = limits.max_running_per_rank
        groups = spec.pools.GROUPS
        layout = _layout(config, spec, k)
        copies = layout.copies if layout else {}
        memory = _memory(config, spec, limits, ranks)
        if config.kv_cache_memory:
            budget = config.kv_cache_memory
        elif memory:
            budget = memory.pool_budget
        else:                                   # enough for the limits
            budget = capacity.bytes_for(groups, running_per_rank, capacity.tokens_for(
                groups, running_per_rank, limits.max_model_len), copies)
        try:
            cap = capacity.plan(groups, budget, running_per_rank, copies)
        except ValueError as exc:
            raise ConfigError(f"spec {spec.SPEC_PATH}: {exc}") from None
        if cap.tokens < limits.max_model_len:
            raise ConfigError(f"the pools hold {cap.tokens} tokens per rank, less than one "
                              f"request of max_model_len {limits.max_model_len}; give the "
                              "cache more memory or lower --max-model-len")
        return cls(spec, k, limits, cap, config.max_logprobs, config.max_stop_strings,
                   config.max_stop_token_ids, layout, memory, config.speculative_policy,
                   config.engram_placement)

    def check_weights(self, held: int) -> None:
        """ConfigError if a rank's loaded weights, its pools and the workspace overrun
        the usable device memory of the plan: the checkpoint is heavier than the spec's
        `weights` section says (or its scales are float, not e8m0)."""
        memory = self.memory
        if memory is None:
            return
        over = held + self.capacity.bytes + memory.workspace - memory.usable
        if over > 0:
            gib = 2**30
            raise ConfigError(
                f"the checkpoint holds {held / gib:.2f} GiB per rank where spec "
                f"{self.spec.SPEC_PATH} plans {memory.weights.total / gib:.2f} GiB: with "
                f"{self.capacity.bytes / gib:.2f} GiB of pools and the workspace it overruns "
                f"the usable {memory.usable / gib:.2f} GiB by {over / gib:.2f} GiB; make the "
                "spec's weights section say how the checkpoint stores its weights, or "
                "lower --kv-cache-memory")

    def concurrency(self, length: int | None = None) -> int:
        """Requests of `length` tokens (default max_model_len) the replica runs at once:
        on each rank the fewer of those its pools hold and of its running limit."""
        length = length or self.limits.max_model_len
        need = capacity.tokens_for(self.spec.pools.GROUPS, 1, length)
        per_rank = min(self.capacity.tokens // need if need else self.limits.max_running_per_rank,
                       self.limits.max_running_per_rank)
        ranks = self.memory.ranks if self.memory else self.limits.ranks
        return min(per_rank * ranks, self.limits.max_num_seqs)

    def scheduler(self) -> Scheduler:
        """A scheduler on these limits, with empty pools and slot table."""
        c = self.spec.contract
        return Scheduler(self.limits, BlockPool(self.capacity.blocks, c.RANKS),
                         {g: grp.blocks_for for g, grp in self.spec.pools.GROUPS.items()},
                         SlotTable(c.RANKS, c.REQUEST_SLOTS_PER_RANK), self.layout,
                         self.speculation())

    def speculation(self) -> Speculation:
        """The policy choosing each decode step's K (runtime/core/speculation.py)."""
        return make_speculation(self.policy, self.k)

    @property
    def adaptive(self) -> bool:
        """Whether steps choose their K: every decode launches a fused kernel."""
        return self.policy == "adaptive"

    @property
    def vocab_size(self) -> int:
        return self.spec.architecture.CONFIG["vocab_size"]

    def check(self, ids: list[int], params: SamplingParams) -> None:
        """InvalidParam for what the model cannot take or the limits refuse: an empty
        prompt, token ids outside the vocabulary, more log-probs, stop strings or stop
        token ids than the limits (check_prompt, then check_params)."""
        self.check_prompt(ids)
        self.check_params(params)

    def check_prompt(self, ids: list[int]) -> None:
        """InvalidParam for a prompt the model cannot take: empty, or a token id outside
        the vocabulary. One pass over the ids (in C): the requests of a body share their
        prompts, so each distinct prompt is checked once (runtime/engine/intake.py)."""
        if not ids:
            raise InvalidParam("prompt", "the prompt is empty")
        self._check_ids("prompt", ids)

    def check_params(self, params: SamplingParams) -> None:
        """InvalidParam for params the limits refuse; costs O(the params' own lists),
        whatever the prompt's length."""
        self._check_stops(params)
        self._check_ids("stop_token_ids", params.stop_token_ids)
        self._check_ids("logit_bias", [t for t, _ in params.logit_bias])
        if params.logprobs is not None and params.logprobs > self.max_logprobs:
            raise InvalidParam("logprobs", f"logprobs must be at most {self.max_logprobs}, "
                                           f"got {params.logprobs}")

    def _check_ids(self, param: str, tokens) -> None:
        """InvalidParam naming the first token id outside the vocabulary (min and max
        find whether there is one; only then is it looked for)."""
        if not tokens or (min(tokens) >= 0 and max(tokens) < self.vocab_size):
            return
        bad = next(t for t in tokens if not 0 <= t < self.vocab_size)
        raise InvalidParam(param, f"token id {bad} is outside the vocabulary "
                                  f"[0, {self.vocab_size})")

    def _check_stops(self, params: SamplingParams) -> None:
        """The stop lists within the limits (each costs work on every generated token)."""
        for param, given, most in (("stop", params.stop, self.max_stop_strings),
                                   ("stop_token_ids", params.stop_token_ids,
                                    self.max_stop_token_ids)):
            if len(given) > most:
                raise InvalidParam(param, f"{param} may hold at most {most} entries, got "
                                          f"{len(given)}")
        longest = max(map(len, params.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise InvalidParam("stop", f"a stop string may be at most {MAX_STOP_CHARS} "
                                       f"characters long, got one of {longest}")

    def validate(self, ids: list[int], params: SamplingParams) -> None:
        """InvalidParam if a request of these ids and params could never run here."""
        self.check(ids, params)
        formulas = {g: grp.blocks_for for g, grp in self.spec.pools.GROUPS.items()}
        reason = refusal(len(ids), self.limits, formulas, self.capacity.blocks)
        if reason:
            raise InvalidParam("prompt", reason)


def pool_limits(config: Any, spec: ModuleType) -> tuple[SchedulerConfig, dict[str, int]]:
    """(the limits in force, the ring pages kept for cached prefixes: Layout.copies)."""
    k, limits = _resolve(config, spec)
    layout = _layout(config, spec, k)
    return limits, layout.copies if layout else {}


def least_bytes(groups: Any, limits: SchedulerConfig, copies: dict[str, int]) -> int:
    """Pool bytes per rank for the ring pages of every running request and one request
    of max_model_len: the least a plan must leave the pools."""
    return capacity.bytes_for(groups, limits.max_running_per_rank,
                              capacity.tokens_for(groups, 1, limits.max_model_len), copies)


def _memory(config: Any, spec: ModuleType, limits: SchedulerConfig,
            ranks: int | None) -> MemoryPlan | None:
    """The memory plan of a device of config.device_memory bytes per rank (None: pools
    sized by --kv-cache-memory or by the limits); ConfigError if it does not fit."""
    if config.device_memory is None:
        return None
    try:
        memory = MemoryPlan.of(spec, config.device_memory, config.gpu_memory_utilization,
                               limits, ranks, config.engram_placement)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if memory.shortfall and not config.kv_cache_memory:
        gib = 2**30
        raise ConfigError(
            f"spec {spec.SPEC_PATH} does not fit {config.device_memory / gib:.1f} GiB per "
            f"rank at --gpu-memory-utilization {config.gpu_memory_utilization}: weights "
            f"{memory.weights.total / gib:.1f} GiB + workspace {memory.workspace / gib:.1f} "
            f"GiB exceed the usable {memory.usable / gib:.1f} GiB by "
            f"{memory.shortfall / gib:.1f} GiB per rank")
    return memory


def _layout(config: Any, spec: ModuleType, k: int) -> Layout | None:
    if not config.enable_prefix_caching:
        return None
    try:
        return Layout.of(spec.pools.GROUPS, spec.architecture.CONFIG,
                         spec.contract.BLOCK_SIZE, k)
    except Unsupported as exc:
        raise ConfigError(f"--enable-prefix-caching: spec {spec.SPEC_PATH}: {exc}; "
                          "serve it with --no-enable-prefix-caching") from exc


def _resolve(config: Any, spec: ModuleType) -> tuple[int, SchedulerConfig]:
    """The K and limits in force: the spec's, lowered by the command line."""
    c = spec.contract
    k = c.DEFAULT_NUM_SPECULATIVE_TOKENS if config.num_speculative_tokens is None \
        else config.num_speculative_tokens
    if k not in c.DECODE_LAYOUTS:
        raise ConfigError(f"--num-speculative-tokens {k}: spec {spec.SPEC_PATH} has decode "
                          f"layouts for K in {sorted(c.DECODE_LAYOUTS)}")
    if k > MAX_K:
        raise ConfigError(f"--num-speculative-tokens {k}: this runtime verifies at most "
                          f"{MAX_K} draft tokens per step")
    if config.engram_placement not in PLACEMENTS:
        raise ConfigError(f"--engram-placement {config.engram_placement!r}: one of "
                          f"{', '.join(PLACEMENTS)}")
    policy = getattr(config, "speculative_policy", "fixed")
    if policy not in POLICIES:
        raise ConfigError(f"--speculative-policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == "adaptive" and not k:
        raise ConfigError("--speculative-policy adaptive chooses K per step up to "
                          "--num-speculative-tokens, which is 0: give it the most drafts "
                          "a step may take (1 to 3)")
    limits = {}
    for name in ("max_num_batched_tokens", "long_prefill_token_threshold", "max_model_len",
                 "max_num_seqs"):
        ceiling, value = getattr(c, name.upper()), getattr(config, name)
        if value is not None and not 0 < value <= ceiling:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be in [1, {ceiling}] "
                              f"(the limit of {spec.SPEC_PATH})")
        limits[name] = value or ceiling
    extent = c.effective_extent(limits["max_num_batched_tokens"],
                                limits["long_prefill_token_threshold"], limits["max_model_len"])
    if not config.enable_chunked_prefill and limits["max_model_len"] > extent:
        raise ConfigError(f"--no-enable-chunked-prefill needs max_model_len "
                          f"({limits['max_model_len']}) within one prefill dispatch ({extent}); "
                          "lower --max-model-len")
    # adaptive: every K up to k, each step cut by its own layout's batch; a rank runs as
    # many requests as the widest of them takes (fixed: K's; the steps of the last
    # tokens before max_model_len run fewer drafts, on their own layouts: step_ks)
    ks = step_ks(policy, k, c.DECODE_LAYOUTS)
    batches = tuple(c.DECODE_LAYOUTS[j].batch if j in ks else 0 for j in range(k + 1))
    return k, SchedulerConfig(
        ranks=c.RANKS, prefill_slots=c.SLOTS_PER_RANK,
        decode_batch=max(batches) if policy == "adaptive" else batches[k],
        batches=batches, micro_batches=c.DECODE_MICRO_BATCHES, k=k, effective_extent=extent,
        max_num_batched_tokens=limits["max_num_batched_tokens"],
        max_num_seqs=limits["max_num_seqs"], max_model_len=limits["max_model_len"],
        chunked_prefill=config.enable_chunked_prefill,
        prefix_affinity=config.prefix_affinity_threshold,
        fair_share=config.fair_share_preemption)
