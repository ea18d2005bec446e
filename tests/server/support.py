"""A real uvicorn server on a free loopback port, in a thread of the test process."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from runtime.async_engine import AsyncEngine
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
