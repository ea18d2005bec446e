"""Host work per engine step at a deployment's scale: does it grow with the context?

The real engine core's step (runtime/process/engine_core.EngineCore.step: the scheduler,
model runner, generated launch tables, sampler, the commit of the tokens and the step's
message to the server, encoded; the server's text is made in its own process) runs
decode steps for `--rows` running requests (at most what the spec runs at once: the
tiny spec's 64) of each context length (at most the spec's max_model_len, less room to
decode), with the kernels stubbed at the launch boundary: the dry-run backend on the
meta device, where every tensor has its real shape and no storage, so that V4-Flash's
pools for 256 requests of 1M tokens cost nothing and a device op costs only its
dispatch (as a launch on a GPU costs the host). The step's one read from the device
(runtime/device/step_result.to_host) reads ones: each row keeps one token, id 1.

The requests are placed as if their prompts had been prefilled (the prefill of 256 x 1M
tokens is not what this measures): each takes a rank, a slot and the blocks of its
context through the scheduler's own cache manager, and the first steps (a new owner's
block table is written whole once) are left out of the figures.

Per spec, K (MTP off and on) and context it prints, as medians over `--steps` steps:

    host ms/step    the wall time of the core's step less the time inside its device ops and
                    less what timing them costs (calibrated by replaying one step's ops),
                    per step, the median; on meta an op costs its Python shape function,
                    which a GPU does not have, while a GPU's launch costs the host ~5 us
                    an op (times the next column)
    ops/step        the device ops the step dispatches
    wall ms/step    the wall time of the core's step on meta, ops included
    H2D B/step      bytes copied from the host to the device (runtime/device/upload.Uploads)
    plan B/step     for the mp executor: the bytes of the step's plan to the rank
                    workers, as its writer encodes them (runtime/executor/step_plan.
                    PlanWriter); the mp rows' host time adds the writer's and rank 0's
                    reader's time to the step's (an upper bound: the ranks run their
                    shares of the runner's work in parallel, a rank only its own)

    .venv/bin/python bench/host_overhead.py [--specs deepseek-v4-flash tiny] [--rows 256]
        [--contexts 1024 32768 131072 1048576] [--ks 0 1] [--steps 10] [--rounds 4]
        [--against REV] [--breakdown] [--json]

`--against REV` measures the engine of git revision REV the same way, in a worktree of
its own, this file measuring (REV's pickled plans stand for the plan bytes before the
diffs), and prints its rows after today's. `--breakdown` prints under each row without
mp its host time by phase: the scheduler's, the runner's (the sampler's and the MTP
slots' update within it), the commit of the tokens to deltas, and the rest of the core's
step (its message and metrics).
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
# --tree DIR: measure the engine of another checkout (a baseline; see --against)
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else HERE
sys.path.insert(0, str(TREE))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import generated  # noqa: E402
from runtime.core.config import EngineConfig  # noqa: E402
from runtime.core.request import Request, Status  # noqa: E402
from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.device import model_runner, step_result  # noqa: E402
from runtime.engine.engine import Engine  # noqa: E402
from runtime.process.engine_core import EngineCore  # noqa: E402
from runtime.weights.fake_checkpoint import FakeCheckpoint  # noqa: E402
from runtime.weights.loader import load_params  # noqa: E402

try:
    from runtime.executor.step_plan import PlanReader, PlanWriter  # noqa: E402
except ImportError:                 # a baseline from before the plan diffs
    PlanReader = PlanWriter = None

WARM_STEPS = 3
PARAMS = SamplingParams(max_tokens=1 << 30, ignore_eos=True, temperature=0.0)


class _DeviceOps(TorchDispatchMode):
    """Counts the ops a step dispatches (`count`: every op, whose timing costs the same)
    and the time spent inside its device ops (`seconds`: ops whose result is on the
    device; on meta the dispatcher and the op's shape function, on a GPU its launch, ~5
    us each). An op on host tensors (a conversion before an upload) is host work."""

    def __init__(self):
        super().__init__()
        self.count, self.seconds = 0, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        spent = time.perf_counter() - t0
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if not isinstance(first, torch.Tensor) or first.device.type != "cpu":
            self.seconds += spent
        self.count += 1
        return out


class _MetaReadsOnes(TorchDispatchMode):
    """A copy from the meta device to the host gives ones of its shape and dtype."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "meta" \
                and kwargs.get("device", args[0].device).type == "cpu":
            return torch.ones(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        return func(*args, **kwargs)


@contextmanager
def _reads_ones():
    """The step's read from the meta device gives ones (a baseline without the read's
    own function: every op of its to_host under _MetaReadsOnes)."""
    if hasattr(step_result, "read"):
        real, step_result.read = step_result.read, _ones
        try:
            yield
        finally:
            step_result.read = real
        return
    real = model_runner.to_host

    def to_host(sampled, max_logprobs):
        with _MetaReadsOnes():
            return real(sampled, max_logprobs)

    model_runner.to_host = to_host
    try:
        yield
    finally:
        model_runner.to_host = real


def _ones(values: torch.Tensor):
    return torch.ones(values.shape, dtype=values.dtype).numpy()


@functools.cache
def _params(spec_name: str):
    """The spec's weights as the release's shapes on the meta device (rank 0's experts)."""
    spec = generated.load(spec_name)
    return load_params(None, spec, "meta", checkpoint=FakeCheckpoint(spec), held=range(1))


def build(spec_name: str, k: int) -> Engine:
    """An engine core's engine (no outputs of its own: the server makes them) of the
    spec on the meta device and the dry-run backend."""
    spec, params = generated.load(spec_name), _params(spec_name)
    config = EngineConfig(spec=spec_name, model=str(TREE / "models" / "tiny"), device="meta",
                          backend="dryrun", num_speculative_tokens=k,
                          enable_prefix_caching=False, detokenize=False)
    if "outputs" in inspect.signature(Engine).parameters:
        return Engine(config, spec, params, None, outputs=False)
    return Engine(config, spec, params, None)            # a baseline: outputs made here


def core_step(engine: Engine):
    """The engine core's step: the step's message to the server, encoded (a baseline
    without EngineCore.step: its run loop's body, outputs turned back into deltas)."""
    core = EngineCore(engine, None, None)
    if hasattr(core, "step"):
        return core.step
    from runtime.process.core_messages import Step
    from runtime.process.engine_core import _delta

    def step():
        deltas = [_delta(o) for o in engine.step()]
        return core.encoder.encode(Step(deltas, [], engine.snapshot()))
    return step


def place(engine: Engine, rows: int, context: int) -> None:
    """`rows` running requests of `context` tokens (one shared prompt list), prefilled:
    the scheduler's admission without the prefill, round robin over the ranks."""
    scheduler, prompt = engine.scheduler, [1] * (context - 1)
    for i in range(rows):
        request = Request(f"r{i}", prompt, PARAMS, i, None, output_ids=[1])
        rank = i % scheduler.config.ranks
        request.status, request.rank = Status.RUNNING, rank
        scheduler.cache.admit(request, [], context - 1)
        request.slot, request.slot_generation = scheduler.slots.acquire(rank)
        scheduler.cache.allocate(request, scheduler.cache.need(request, context - 1))
        request.num_computed = context - 1
        scheduler.running[rank].append(request)
        engine.requests[request.request_id] = request
        if engine.output_processor is not None:
            engine.output_processor.add(request.request_id, prompt)
        engine.executor.sampler.admit(request)      # as a step's new slot owners are


def _module_here(name: str, path: str):
    """A module of this checkout (the tools the bench measures with), whatever --tree."""
    spec = importlib.util.spec_from_file_location(name, HERE / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Uploads = _module_here("v4serve_bench_upload", "runtime/device/upload.py").Uploads


class _Planned:
    """The executor, with each step's plan also written and read as the mp executor's
    would be: its bytes and its host time (a baseline without the plan diffs: its
    pickled Plan, unpickled and localized as its rank 0 did)."""

    def __init__(self, runner):
        self.runner, self.bytes, self.seconds = runner, [], []
        if PlanWriter is not None:
            writer, reader = PlanWriter(), PlanReader(0)        # as rank 0 reads it
            self.write, self.read = (lambda out: writer.write(out, [], [])), reader.read
        else:
            self.write, self.read = _pickled_plans()

    def execute(self, out):
        t0 = time.perf_counter()
        data = self.write(out)
        self.read(data)
        self.seconds.append(time.perf_counter() - t0)
        self.bytes.append(len(data))
        return self.runner.execute(out)

    def __getattr__(self, name):
        return getattr(self.runner, name)


def _pickled_plans():
    """A baseline's plan: (write, read) as its Workers and rank 0 did them."""
    import pickle

    from runtime.executor.step_plan import Plan, localize
    return (lambda out: pickle.dumps(Plan(out, [], []))), \
        (lambda data: localize(pickle.loads(data).out, 0))


def _shapes_only_on_meta() -> None:
    """A baseline's dry-run backend checks values, which meta tensors do not have."""
    from runtime.backends import dryrun
    for name in ("_check_block_ids", "_check_row_lens"):
        check = getattr(dryrun, name)
        setattr(dryrun, name, lambda kernel, named, check=check: None
                if named["pool_ori"].device.type == "meta" else check(kernel, named))


class _Phases:
    """Host time by phase of the core's step (`--breakdown`): each phase's functions
    timed less the device ops inside them, as the step is; "sampling" lies inside
    "runner", and the core's step outside these (its message, the metrics) is the rest."""

    def __init__(self):
        from runtime.core.scheduler import Scheduler
        from runtime.device.mtp_slot_state import MtpSlotState
        from runtime.device.sampler import Sampler
        self.ops: _DeviceOps | None = None          # the step's counter while timed
        self.per_op = 0.0
        self.seconds: dict[str, list[float]] = {}
        for phase, functions in {
                "schedule": [(Scheduler, "schedule")],
                "runner": [(model_runner.ModelRunner, "execute")],
                "sampling": [(Sampler, "sample"), (Sampler, "verify"),
                             (MtpSlotState, "advance")],
                "commit": [(Engine, "_commit")]}.items():
            for owner, name in functions:
                self._wrap(owner, name, phase)

    def _wrap(self, owner, name: str, phase: str) -> None:
        real, phases = getattr(owner, name), self

        @functools.wraps(real)
        def timed(*args, **kwargs):
            ops = phases.ops
            if ops is None:
                return real(*args, **kwargs)
            spent, count, t0 = ops.seconds, ops.count, time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                phases.seconds[phase][-1] += time.perf_counter() - t0 - (
                    ops.seconds - spent) - (ops.count - count) * phases.per_op
        setattr(owner, name, timed)

    def start(self, ops: _DeviceOps, per_op: float) -> None:
        self.ops, self.per_op = ops, per_op
        for phase in ("schedule", "runner", "sampling", "commit"):
            self.seconds.setdefault(phase, []).append(0.0)

    def stop(self) -> None:
        self.ops = None


PHASES: _Phases | None = None         # set by --breakdown


class _Recorded(TorchDispatchMode):
    """The device ops of a step, as called."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs))
        return out


def _timing_cost(calls: list, trials: int = 5) -> float:
    """Seconds _DeviceOps adds to each op of `calls` outside the time it counts: the
    ops replayed under it, less the time inside them and the replay loop's own (the least
    of a few trials). The same op mix as a step, so the same cost per op."""
    replayable = []
    for func, args, kwargs in calls:
        try:
            func(*args, **kwargs)
        except RuntimeError:                # a read of a meta tensor (the step's reads)
            continue
        replayable.append((func, args, kwargs))

    def noop(*args, **kwargs):
        return None

    costs = []
    for _ in range(trials):
        with _DeviceOps() as counted:
            t0 = time.perf_counter()
            for func, args, kwargs in replayable:
                func(*args, **kwargs)
            timed = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _, args, kwargs in replayable:
            noop(*args, **kwargs)
        loop = time.perf_counter() - t0
        costs.append((timed - counted.seconds - loop) / len(replayable))
    return max(0.0, min(costs))


class _Run:
    """One configuration's engine, placed, and its figures so far."""

    def __init__(self, spec_name: str, k: int, context: int, rows: int):
        engine = build(spec_name, k)
        limits = engine.limits
        self.rows = min(rows, limits.max_num_seqs, limits.max_running_per_rank * limits.ranks)
        place(engine, self.rows, context)
        self.planned = engine.executor = _Planned(engine.executor)
        self.engine, self.spec, self.k, self.context = engine, spec_name, k, context
        self.step = core_step(engine)
        self.wall, self.host, self.ops, self.uploads = [], [], [], []
        self.phases: list[dict[str, float]] = []
        for _ in range(WARM_STEPS):
            self.step()
        with _Recorded() as recorded:
            self.step()
        self.per_op = _timing_cost(recorded.calls)
        self.planned.bytes.clear()
        self.planned.seconds.clear()

    def round(self, steps: int) -> None:
        """`steps` steps timed as they are; then `steps` with the device ops timed, whose
        host time is their wall time less the time inside the ops and the timing's cost
        per op (one step's own figures: the machine's noise in the ops cancels)."""
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step()
            self.wall.append(time.perf_counter() - t0)
        for _ in range(steps):
            with _DeviceOps() as counted:
                if PHASES is not None:
                    PHASES.start(counted, self.per_op)
                t0 = time.perf_counter()
                self.step()
                timed = time.perf_counter() - t0
            if PHASES is not None:
                PHASES.stop()
                self.phases.append({p: v[-1] for p, v in PHASES.seconds.items()})
            self.host.append(timed - counted.seconds - counted.count * self.per_op)
            self.ops.append(counted.count)

    def count_uploads(self, steps: int = 3) -> None:
        for _ in range(steps):
            with Uploads() as counted:
                self.step()
            self.uploads.append(counted.bytes)

    def figures(self) -> list[dict]:
        """The uni row and the mp row (its plan written and read on top), medians."""
        assert self.engine.scheduler.num_running == self.rows, "a request left early"
        median = statistics.median
        plan_ms = median(self.planned.seconds) * 1e3
        host = median(self.host) * 1e3 - plan_ms
        common = dict(spec=self.spec, k=self.k, context=self.context, rows=self.rows,
                      ops_per_step=int(median(self.ops)),
                      wall_ms_per_step=round(median(self.wall) * 1e3, 3),
                      h2d_bytes_per_step=int(median(self.uploads)))
        uni = dict(common, mp=False, host_ms_per_step=round(host, 3), plan_bytes_per_step=0)
        if self.phases:
            by = {p: median(step[p] for step in self.phases) * 1e3 for p in self.phases[0]}
            by["rest"] = host - by["schedule"] - by["runner"] - by["commit"]
            uni["phases_ms"] = {p: round(v, 3) for p, v in by.items()}
        return [uni,
                dict(common, mp=True, host_ms_per_step=round(host + plan_ms, 3),
                     plan_bytes_per_step=int(median(self.planned.bytes)))]


def measure(spec_name: str, k: int, contexts: list[int], rows: int, steps: int,
            rounds: int) -> list[dict]:
    """Every context of one spec and K, their rounds interleaved, so that each sees the
    machine as the others do."""
    with _reads_ones():
        runs = [_Run(spec_name, k, context, rows) for context in contexts]
        for _ in range(rounds):
            for run in runs:
                run.round(steps)
        for run in runs:
            run.count_uploads()
    return [row for run in runs for row in run.figures()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=["deepseek-v4-flash", "tiny"])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--contexts", type=int, nargs="+",
                        default=[1024, 32768, 131072, 1048576])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=10, help="per round and pass")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--against", metavar="REV", default=None,
                        help="also measure the engine at git revision REV (its rows follow)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also the host time by phase (this checkout's engine)")
    parser.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.breakdown and not args.tree:
        global PHASES
        PHASES = _Phases()
    if args.tree:
        _shapes_only_on_meta()
    if not args.json and not args.tree:
        print(f"{'tree':<8} {'spec':<18} {'K':>1} {'context':>8} {'rows':>4} {'mp':>3} "
              f"{'host ms/step':>12} {'ops/step':>8} {'wall ms/step':>12} "
              f"{'H2D B/step':>10} {'plan B/step':>11} {'B/row':>6}")
    for spec_name in args.specs:
        limit = generated.load(spec_name).contract.MAX_MODEL_LEN
        # the longest context leaves room to decode every step
        room = 2 * args.steps * args.rounds + 64
        contexts = sorted({min(c, limit - room) for c in args.contexts})
        for k in args.ks:
            for row in measure(spec_name, k, contexts, args.rows, args.steps, args.rounds):
                _print(dict(row, tree=args.tree and "baseline" or "now"), args.json)
    if args.against:
        _against(args.against, [a for a in (argv or sys.argv[1:])
                                if a not in ("--against", args.against)])
    return 0


def _against(rev: str, argv: list[str]) -> None:
    """The same measurement in a worktree of `rev`, this file measuring."""
    with tempfile.TemporaryDirectory(prefix="v4serve-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", "-q",
                        str(tree), rev], check=True)
        try:
            out = subprocess.run([sys.executable, __file__, *argv, "--tree", str(tree)],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force",
                            str(tree)], check=True)
    for line in out.splitlines():
        row = json.loads(line) if line.startswith("{") else None
        if row is None:
            print(line.replace("baseline", rev[:8]), flush=True)
        else:
            _print(dict(row, tree=rev[:8]), "--json" in argv)


def _print(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
        return
    per_row = row["plan_bytes_per_step"] / row["rows"]
    print(f"{row['tree']:<8} {row['spec']:<18} {row['k']:>1} {row['context']:>8} {row['rows']:>4} "
          f"{'yes' if row['mp'] else 'no':>3} {row['host_ms_per_step']:>12.3f} "
          f"{row['ops_per_step']:>8} {row['wall_ms_per_step']:>12.3f} "
          f"{row['h2d_bytes_per_step']:>10} {row['plan_bytes_per_step']:>11} "
          f"{per_row:>6.0f}", flush=True)
    if "phases_ms" in row:
        by = row["phases_ms"]
        print(f"{'':<8} host ms by phase: schedule {by['schedule']:.3f}, runner "
              f"{by['runner']:.3f} (sampling {by['sampling']:.3f}), commit "
              f"{by['commit']:.3f}, the rest of the core's step {by['rest']:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
