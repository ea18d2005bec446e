"""The engine core as a process of its own behind the API server: the same answers as an
engine in the server's process, loud failure when the core dies, no orphan when the
server dies, and one slow client never slows the others."""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from runtime.core.sampling_params import SamplingParams
from tests.model.support import reference_params
from tests.runtime.engine_support import make_engine
from tests.server.support import ServerProcess

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by its parent, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def test_answers_equal_an_engine_in_process_stop_strings_and_logprobs_included():
    engine = make_engine(reference_params())
    engine.add_request("t5 t6 t7", SamplingParams(temperature=0, max_tokens=12, logprobs=3))
    logprobs = []
    while engine.has_unfinished():
        for want in engine.step():
            logprobs += [lp.logprob for lp in want.logprobs]
    stop = want.text.split(" ")[4]
    with ServerProcess() as server:
        info = httpx.get(f"{server.url}/server_info").json()
        assert info["engine"] == "process" and info["engine_pid"] != server.proc.pid
        body = {"model": "tiny", "prompt": "t5 t6 t7", "max_tokens": 12, "temperature": 0,
                "logprobs": 3}
        whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
        choice = whole["choices"][0]
        assert choice["text"] == want.text and choice["finish_reason"] == "length"
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(logprobs, abs=1e-6)
        stopped = httpx.post(f"{server.url}/v1/completions", timeout=60,
                             json={**body, "stop": [stop]}).json()["choices"][0]
        assert stopped["text"] == want.text[:want.text.index(stop)]
        assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
        # the stop aborted the request in the core; the next snapshot it pushes says so
        idle = 'vllm:num_requests_running{model_name="tiny"} 0.0'
        deadline = time.monotonic() + 5
        while idle not in httpx.get(f"{server.url}/metrics").text:
            assert time.monotonic() < deadline, "the core never reported the abort"
            time.sleep(0.05)


def test_a_killed_core_fails_streams_and_health_within_a_second():
    with ServerProcess() as server:
        core = server.core_pid()
        started, ended = threading.Event(), {}

        def stream() -> None:
            body = {"model": "tiny", "prompt": "t5", "max_tokens": 2000, "stream": True,
                    "ignore_eos": True, "temperature": 0}
            lines = []
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                              timeout=60) as resp:
                for line in resp.iter_lines():
                    started.set()
                    if line:
                        lines.append(line)
            ended.update(at=time.monotonic(), lines=lines)

        worker = threading.Thread(target=stream)
        worker.start()
        assert started.wait(30)
        os.kill(core, signal.SIGKILL)
        killed = time.monotonic()
        worker.join(timeout=10)
        assert not worker.is_alive() and ended["at"] - killed < 1.0
        assert any('"code": 503' in line for line in ended["lines"])
        assert ended["lines"][-1] == "data: [DONE]"
        assert httpx.get(f"{server.url}/health").status_code == 503
        late = httpx.post(f"{server.url}/v1/completions", timeout=10,
                          json={"model": "tiny", "prompt": "t5", "max_tokens": 2})
        assert late.status_code == 503 and "exited" in late.json()["error"]["message"]


def test_the_core_dies_with_the_server_even_by_sigkill():
    with ServerProcess() as server:
        core = server.core_pid()
        server.proc.kill()
        deadline = time.monotonic() + 5
        while _alive(core) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(core)


def test_a_client_that_stops_reading_does_not_slow_the_others():
    with ServerProcess() as server:
        body = {"model": "tiny", "prompt": "t5 t6", "max_tokens": 48, "ignore_eos": True,
                "temperature": 0}

        def timed() -> float:
            start = time.monotonic()
            assert httpx.post(f"{server.url}/v1/completions", json=body,
                              timeout=60).status_code == 200
            return time.monotonic() - start

        alone = min(timed() for _ in range(2))
        stalled = httpx.Client(timeout=120)
        with stalled.stream("POST", f"{server.url}/v1/completions",
                            json={**body, "max_tokens": 3000, "stream": True}) as resp:
            assert resp.status_code == 200        # headers read; the body is never read
            beside = min(timed() for _ in range(2))
        stalled.close()
        # the stalled stream costs one batch row per step, not a stalled event loop
        assert beside < 2 * alone + 1.0, (alone, beside)


def test_a_core_that_fails_to_load_ends_the_server_with_its_reason(tmp_path):
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    shutil.copy(REPO / "tests/fixtures/v4-tiny/config.json", tmp_path / "config.json")
    result = subprocess.run(
        [sys.executable, "-m", "server", "--spec", "reference", "--model", str(tmp_path),
         "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert "the engine core failed to start: CheckpointError" in result.stderr
    assert "no *.safetensors files" in result.stderr


def test_a_killed_rank_worker_fails_the_server_and_leaves_no_process():
    """mp: SIGKILL one of eight rank workers mid-generation; /health is 503 within 10 s
    and the engine core and every other rank are gone."""
    from server.cli.spec_check import default_model

    with ServerProcess("--spec", "tiny", "--model", str(default_model("tiny")),
                       "--distributed-executor-backend", "mp", "--enforce-eager") as server:
        info = httpx.get(f"{server.url}/server_info").json()
        ranks = [p["pid"] for p in info["processes"]]
        assert info["executor"] == "mp" and len(ranks) == 8
        started = threading.Event()

        def stream() -> None:
            body = {"model": "tiny", "prompt": "def", "max_tokens": 2000, "stream": True,
                    "ignore_eos": True, "temperature": 0}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                              timeout=60) as resp:
                for _ in resp.iter_lines():
                    started.set()

        client = threading.Thread(target=stream, daemon=True)
        client.start()
        assert started.wait(60)
        os.kill(ranks[3], signal.SIGKILL)
        killed = time.monotonic()
        while httpx.get(f"{server.url}/health").status_code != 503:
            assert time.monotonic() - killed < 10, "still healthy 10 s after the kill"
            time.sleep(0.1)
        client.join(timeout=10)
        assert not client.is_alive()
        deadline = time.monotonic() + 10
        left = [pid for pid in [info["engine_pid"], *ranks] if _alive(pid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if _alive(pid)]
        assert not left, f"processes left: {left}"
