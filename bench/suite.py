"""The README's test-suite figures, measured as a newcomer meets them: a fresh clone of
HEAD, nothing installed, an empty graph cache, then `.ci/run` (the README's `make test`,
then the generated-code drift check) and `make test-unit`, each timed.

    .venv/bin/python bench/suite.py [--keep DIR]

Prints the tests each command ran, its wall time and the README sentence those give.
The clone is made with `git clone` of this checkout's HEAD (uncommitted changes are not
measured; the header says so); the graph cache is a fresh directory
(V4SERVE_CACHE_DIR), so every compile the suite needs happens in it. Run it on a quiet
machine: other work on the cores lengthens every figure.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"(\d+) passed(?:, (\d+) skipped)?(?:, (\d+) deselected)?")


def run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, str]:
    """Seconds `cmd` took and its output (also written to `log`); exits on failure."""
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    log.write_text(done.stdout + done.stderr)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}); its output is in {log}")
    return seconds, done.stdout + done.stderr


def passed(output: str) -> int:
    """Tests passed according to pytest's last summary line of `output`."""
    found = SUMMARY.findall(output)
    if not found:
        sys.exit("no pytest summary in the output")
    return int(found[-1][0])


def head() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return sha + (" (uncommitted changes not measured)" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, default=None,
                        help="clone into this directory and keep it (default: a temporary "
                             "one, removed at the end)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="v4serve-suite-"))
    clone, cache = work / "clone", work / "graph-cache"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    cache.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["V4SERVE_CACHE_DIR"] = str(cache)
    print(f"bench/suite.py at {head()}, {os.cpu_count()} cores, clone in {clone}", flush=True)
    try:
        ci_s, ci_out = run([".ci/run"], clone, env, work / "ci.log")
        unit_s, unit_out = run(["make", "test-unit"], clone, env, work / "unit.log")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    tests, fast = passed(ci_out), passed(unit_out)
    print(f".ci/run (make test, then make check-generated), venv install included: "
          f"{tests} tests passed in {ci_s / 60:.1f} min")
    print(f"make test-unit: {fast} tests passed in {unit_s:.0f} s")
    print(f"README: ruff, then pytest: {tests:,} tests, about {round(ci_s / 60)} minutes on "
          f"a {os.cpu_count()}-core machine; `make test-unit` runs the {fast} fast ones in "
          f"{round(unit_s)} seconds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
