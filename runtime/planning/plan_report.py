"""`v4serve plan`: does a spec fit a device, and how many tokens of cache does each rank
hold? From the spec alone (no weights, no device): the engine's own admission plan
(runtime/planning/admission.py) on a device of --device-memory bytes per rank, so the figures
are the ones a real run logs at start and reports on /server_info. (This module
imports no torch; the generated package it reads does.)

    v4serve plan --spec deepseek-v4-flash --device-memory 141GiB --max-model-len 1048576

A spec with Engram tables (V4.1) also gets their bytes and, for each placement
(--engram-placement device | host), the tables' device bytes per rank, host bytes per
node and what they leave the cache: pool bytes and tokens per rank.
"""
from __future__ import annotations

from typing import Any

from runtime.planning import capacity
from runtime.planning.admission import Admission, ConfigError, least_bytes, pool_limits
from runtime.planning.engram_tables import PLACEMENTS, EngramTables
from runtime.planning.memory_plan import MemoryPlan, weight_bytes

GIB = 2**30


def plan(config: Any, spec: Any, ranks: int | None = None) -> dict[str, Any]:
    """The figures of `config` on `spec` (report's where it fits, else what is missing)."""
    try:
        return report(Admission.plan(config, spec, ranks))
    except ConfigError as exc:
        return _does_not_fit(config, spec, ranks, str(exc))


def report(admission: Admission) -> dict[str, Any]:
    """The figures of an admission plan: what `v4serve plan` prints, the startup log
    shows and /server_info returns."""
    spec, cap, limits, memory = (admission.spec, admission.capacity, admission.limits,
                                 admission.memory)
    ranks = memory.ranks if memory else spec.contract.RANKS
    weights = memory.weights if memory else weight_bytes(spec, None, admission.engram_placement)
    groups = spec.pools.GROUPS
    per_rank = admission.concurrency() // ranks if ranks else 0
    tables = EngramTables.of(spec)
    return {
        "fits": True, "spec": spec.SPEC_NAME, "spec_path": spec.SPEC_PATH, "ranks": ranks,
        "spec_ranks": spec.contract.RANKS,
        **_weights(spec, ranks, weights),
        **(_device(memory, spec) if memory else {"device_memory": None}),
        "pools": {g: {"blocks": n, "bytes": n * groups[g].block_bytes, **entries(groups[g])}
                  for g, n in sorted(cap.blocks.items())},
        "full_group_bytes_per_million_tokens": sum(
            entries(g).get("bytes_per_million_tokens", 0) for g in groups.values()),
        "pool_bytes_per_rank": cap.bytes, "tokens_per_rank": cap.tokens,
        "tokens_per_replica": cap.tokens * ranks, "max_model_len": limits.max_model_len,
        "max_num_seqs": limits.max_num_seqs,
        "max_running_per_rank": limits.max_running_per_rank,
        "max_concurrency": admission.concurrency(), "max_concurrency_per_rank": per_rank,
        **({"engram": engram(
            tables, admission.engram_placement, ranks, memory, groups, limits,
            admission.layout.copies if admission.layout else {})} if tables else {}),
    }


def engram(tables: EngramTables, placement: str, ranks: int, memory: MemoryPlan | None,
           groups: Any, limits: Any, copies: dict[str, int]) -> dict[str, Any]:
    """The Engram tables' bytes, and per placement what they take from each rank's device
    and each node's host and, with a device memory, what they leave the cache."""
    out = {"placement": placement, "layers": list(tables.layers), "rows": list(tables.rows),
           "format": tables.format, "row_bytes": tables.row_bytes,
           "table_bytes": tables.bytes, "placements": {}}
    for where in PLACEMENTS:
        out["placements"][where] = {
            "device_bytes_per_rank": tables.device_bytes(where, ranks),
            "host_bytes_per_node": tables.host_bytes(where),
            **(_cache_left(memory.placed(tables, where), groups, limits, copies)
               if memory else {})}
    return out


def _cache_left(memory: MemoryPlan, groups: Any, limits: Any,
                copies: dict[str, int]) -> dict[str, Any]:
    """What a memory plan leaves the cache: its pool budget per rank and the tokens the
    pools hold there (as the admission plans them), or the bytes per rank missing for
    the running requests' rings and one request of max_model_len."""
    need = least_bytes(groups, limits, copies)
    if memory.pool_budget < need:
        return {"fits": False, "pool_budget_per_rank": max(0, memory.pool_budget),
                "shortfall_per_rank": need - memory.pool_budget}
    cap = capacity.plan(groups, memory.pool_budget, limits.max_running_per_rank, copies)
    return {"fits": True, "pool_budget_per_rank": memory.pool_budget,
            "pool_bytes_per_rank": cap.bytes, "tokens_per_rank": cap.tokens,
            "tokens_per_replica": cap.tokens * memory.ranks}


def entries(group: Any) -> dict[str, Any]:
    """A group's entry format and what it costs: a full group per token of context (its
    layers' entries over the tokens an entry covers) and per 1M tokens; a ring group per
    request (its ring in every layer)."""
    out = {"format": group.format, "entry_bytes": group.entry_bytes}
    if group.ring_pages is None:
        per_token = len(group.layers) * group.entry_bytes / group.tokens_per_row
        return {**out, "bytes_per_token": per_token,
                "bytes_per_million_tokens": round(per_token * 2**20)}
    return {**out, "bytes_per_request": group.ring_pages * group.block_bytes}


def _weights(spec: Any, ranks: int, weights: Any) -> dict[str, Any]:
    """The weights per rank by kind; the Engram rows this rank holds only where the
    spec has Engram tables (0 with them on the host)."""
    c = spec.contract
    held = {"dense": weights.dense, "experts": weights.experts}
    released = {"dense": c.WEIGHTS_DENSE, "experts": c.WEIGHTS_EXPERTS}
    if EngramTables.of(spec):
        held["engram"], released["engram"] = weights.engram, c.WEIGHTS_ENGRAM
    return {"weights_format": c.WEIGHTS_FORMAT, "released": released,
            "experts_per_rank": spec.architecture.CONFIG["n_routed_experts"] // ranks,
            "weight_bytes_per_rank": {**held, "total": weights.total}}


def _device(memory: MemoryPlan, spec: Any) -> dict[str, Any]:
    """The device's figures; a spec whose workspace no rehearsal runs (V4.1 today: its
    kernels run on the torch backend only) says that no rehearsal has checked it."""
    out = {"device_memory": memory.device_memory,
           "gpu_memory_utilization": memory.utilization, "usable_bytes": memory.usable,
           "workspace_bytes": memory.workspace}
    if not getattr(spec, "LAUNCHABLE", True) or not getattr(spec, "REHEARSED", True):
        out["workspace_rehearsed"] = False
    return out


def _does_not_fit(config: Any, spec: Any, ranks: int | None, reason: str) -> dict[str, Any]:
    """The figures of a deployment that does not fit: its weights, and the memory per
    rank missing for them, the workspace and the pools of one max_model_len request."""
    try:
        limits, copies = pool_limits(config, spec)
        memory = MemoryPlan.of(spec, config.device_memory, config.gpu_memory_utilization,
                               limits, ranks, config.engram_placement)
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"v4serve plan: {exc}") from None
    need = least_bytes(spec.pools.GROUPS, limits, copies)
    short = need - memory.pool_budget
    tables = EngramTables.of(spec)
    return {"fits": False, "reason": reason, "spec": spec.SPEC_NAME,
            "spec_path": spec.SPEC_PATH, "ranks": memory.ranks,
            "spec_ranks": spec.contract.RANKS,
            **_weights(spec, memory.ranks, memory.weights), **_device(memory, spec),
            "least_pool_bytes_per_rank": need, "shortfall_per_rank": short,
            "shortfall_per_replica": short * memory.ranks,
            "max_model_len": limits.max_model_len,
            **({"engram": engram(tables, config.engram_placement, memory.ranks, memory,
                                 spec.pools.GROUPS, limits, copies)} if tables else {})}


def render(r: dict[str, Any]) -> str:
    """The figures as text."""
    w = r["weight_bytes_per_rank"]
    lines = [f"spec {r['spec']} ({r['spec_path']}): {r['ranks']} ranks, weights "
             f"{r['weights_format']} (release: dense {r['released']['dense']}, routed "
             f"experts {r['released']['experts']})"]
    if r["ranks"] != r["spec_ranks"]:
        lines.append(f"(the spec serves {r['spec_ranks']} ranks: serving {r['ranks']} takes "
                     f"a spec with topology ranks, dp and ep {r['ranks']})")
    if r["device_memory"] is not None:
        lines.append(f"device memory   {_gib(r['device_memory'])} per rank x "
                     f"{r['gpu_memory_utilization']} = {_gib(r['usable_bytes'])} usable")
    lines.append(f"weights         {_gib(w['total'])} per rank: dense (replicated) "
                 f"{_gib(w['dense'])}, routed experts ({r['experts_per_rank']} per rank) "
                 f"{_gib(w['experts'])}"
                 + (f", Engram rows {_gib(w['engram'])}" if "engram" in w else ""))
    if "workspace_bytes" in r:
        check = ("no rehearsal checks it yet: the spec has no launch wrappers"
                 if r.get("workspace_rehearsed") is False
                 else "tests hold it within 1.25x of the rehearsed peak")
        lines.append(f"workspace       {_gib(r['workspace_bytes'])} per rank (estimated from the "
                     f"shapes; {check})")
    if "engram" in r:
        lines += _engram_lines(r["engram"])
    if not r["fits"]:
        lines.append(f"does not fit: {_gib(r['shortfall_per_rank'])} per rank short "
                     f"({_gib(r['shortfall_per_replica'])} over the {r['ranks']} ranks) of "
                     f"the weights, the workspace and {_gib(r['least_pool_bytes_per_rank'])} "
                     f"of pools for one request of {r['max_model_len']:,} tokens")
        lines.append(f"reason: {r['reason']}")
        return "\n".join(lines)
    lines.append(f"cache pools     {_gib(r['pool_bytes_per_rank'])} per rank:")
    for group, pool in r["pools"].items():
        cost = (f"{pool['bytes_per_token']:>8,.1f} B/token  "
                f"{_gib(pool['bytes_per_million_tokens'])} per 1M tokens"
                if "bytes_per_token" in pool else
                f"ring, {pool['bytes_per_request'] / 2**20:,.2f} MiB per request")
        lines.append(f"  {group:<16} {pool['blocks']:>10,} blocks  {_gib(pool['bytes']):>10}  "
                     f"{pool['format']:<7} {pool['entry_bytes']:>5} B/entry  {cost}")
    lines.append(f"full groups     {_gib(r['full_group_bytes_per_million_tokens'])} per 1M "
                 "tokens of context")
    lines.append(f"cache capacity  {r['tokens_per_rank']:,} tokens per rank, "
                 f"{r['tokens_per_replica']:,} per replica")
    lines.append(f"concurrency     {r['max_concurrency']} requests of {r['max_model_len']:,} "
                 f"tokens at once ({r['max_concurrency_per_rank']} per rank; at most "
                 f"{r['max_running_per_rank']} run per rank, {r['max_num_seqs']} in all)")
    return "\n".join(lines)


def _engram_lines(e: dict[str, Any]) -> list[str]:
    """The Engram tables and what each placement takes and leaves."""
    scales = "fp8 + an e8m0 scale per 32" if e["format"] == "fp8" else e["format"]
    lines = [f"engram tables   {_size(e['table_bytes'])}: {len(e['rows'])} tables (layers "
             f"{', '.join(map(str, e['layers']))}) of {sum(e['rows']):,} rows x "
             f"{e['row_bytes']} B ({scales}); placement {e['placement']} "
             "(--engram-placement)"]
    where = {"device": "sharded by row range", "host": "one copy per node, shared memory"}
    for placement, p in e["placements"].items():
        left = ""
        if "fits" in p:
            left = (f"; cache {_gib(p['pool_budget_per_rank'])}, "
                    f"{p['tokens_per_rank']:,} tokens per rank" if p["fits"] else
                    f"; does not fit, {_gib(p['shortfall_per_rank'])} per rank short")
        lines.append(f"  {placement:<7} {_size(p['device_bytes_per_rank']):>11} per rank on the "
                     f"device, {_size(p['host_bytes_per_node'])} per node on the host "
                     f"({where[placement]}){left}")
    return lines


def _size(n: int) -> str:
    """Bytes in the largest binary unit that leaves a whole part (tiny tables in KiB)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n} B"


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"

