"""DrainingServer: uvicorn that drains on the first exit signal.

SIGTERM (or Ctrl-C) marks the server draining (new requests get 503), waits for the
requests in flight (up to the drain timeout), then stops; a second signal stops at once.
"""
from __future__ import annotations

import asyncio
import logging

import uvicorn

from server.app import ServerState

log = logging.getLogger("v4serve")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state, self.drain_timeout = state, drain_timeout
        self.exit_code = 0

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.draining:          # a second signal: stop now
            return super().handle_exit(sig, frame)
        self.state.draining = True
        log.info("draining %d request(s) in flight", self.state.in_flight)
        asyncio.get_event_loop().create_task(self._drain(sig, frame))

    async def _drain(self, sig: int, frame) -> None:
        deadline = asyncio.get_event_loop().time() + self.drain_timeout
        while self.state.in_flight and asyncio.get_event_loop().time() < deadline:
            await asyncio.sleep(0.05)
        super().handle_exit(sig, frame)
        # A drained shutdown is a clean exit: uvicorn would re-raise the signal after it.
        self._captured_signals.clear()
