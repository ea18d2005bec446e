"""SIGTERM drains: the request in flight finishes, new ones get 503, the process exits 0."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.conftest import REPO
from tests.server.support import free_port

pytestmark = pytest.mark.slow


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server never became healthy")


def test_sigterm_drains_in_flight_requests():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--spec", "reference", "--model",
         str(REPO / "tests/fixtures/v4-tiny"),
         "--port", str(port), "--served-model-name", "tiny"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        _wait_healthy(url, proc)
        started, result = threading.Event(), {}

        def stream() -> None:
            body = {"model": "tiny", "prompt": "t5 t6", "max_tokens": 400, "temperature": 0,
                    "stream": True, "ignore_eos": True}
            reasons, lines = [], []
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        started.set()
                        reasons.append(json.loads(line[6:])["choices"][0]["finish_reason"])
                    lines.append(line)
            result.update(reasons=[r for r in reasons if r], last=lines[-2:])

        worker = threading.Thread(target=stream)
        worker.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = httpx.post(f"{url}/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "t5", "max_tokens": 1})
        assert late.status_code == 503
        worker.join(timeout=120)
        assert result["reasons"] == ["length"] and "data: [DONE]" in result["last"]
        assert proc.wait(timeout=60) == 0
        log = proc.stderr.read()
        for line in ("spec reference (specs/reference.yaml), checkpoint ", "backend torch on cpu",
                     "weights loaded: ", "plan: cache capacity", "KV cache size: ",
                     "Maximum concurrency for 16384 tokens per request: ",
                     "ready: the engine core", "draining 1 request(s) in flight"):
            assert line in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
