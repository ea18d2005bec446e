"""A real uvicorn server on a free loopback port, in a thread of the test process."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from runtime.engine.async_engine import AsyncEngine
from server.app import ServerState, build_app
from tests.model.support import REF
from tests.runtime.engine_support import make_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, params, api_key: str | None = None, **engine_overrides):
        self.engine = AsyncEngine(make_engine(params, **engine_overrides))
        self.state = ServerState(self.engine, REF, "tiny", api_key=api_key)
        self.port = free_port()
        config = uvicorn.Config(build_app(self.state), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.engine.start()
        self.state.ready = True
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.shutdown()


class ServerProcess:
    """`python -m server` on the reference fixture, as a user starts it (the engine in a
    core process of its own), healthy on entry; killed on exit if still running."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None):
        import os
        import subprocess
        import sys

        from tests.conftest import REPO

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--spec", "reference", "--model",
             str(REPO / "tests/fixtures/v4-tiny"), "--port", str(self.port),
             "--served-model-name", "tiny", *flags],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})

    def __enter__(self) -> ServerProcess:
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("the server never became healthy")

    def core_pid(self) -> int:
        import httpx

        return httpx.get(f"{self.url}/server_info").json()["engine_pid"]

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
