"""The messages between the API server and the engine core (msgpack, by msgspec).

Server -> core, on one PUSH/PULL pipe:  Add, Abort, Shutdown.
Core -> server, on another:             Ready once, then one Step per engine step (the
deltas of every request it advanced, the requests it refused, the metrics snapshot),
or Dead when the shared step failed (the core exits after sending it).

Add, Abort and Refused are the engine's intake (runtime/engine/intake.py: an AsyncEngine
queues the same ones): an Add is one body, its prompts once and a Choice per request
(16k requests over one prompt send the prompt once), an Abort ends any number of
requests in one message; Delta is the output processor's input (runtime/engine/
output_processor.py): token ids only, as text, stop strings and detokenization are the
server's.
"""
from __future__ import annotations

import msgspec

from runtime.engine.intake import Abort, Add, Choice, Refused
from runtime.engine.output_processor import Delta

__all__ = ["Abort", "Add", "Choice", "Dead", "Delta", "FromCore", "Ready", "Refused",
           "Shutdown", "Step", "ToCore"]


class Shutdown(msgspec.Struct, tag=True):
    pass


class Ready(msgspec.Struct, tag=True):
    summary: dict
    snapshot: dict


class Step(msgspec.Struct, tag=True):
    deltas: list[Delta]
    refused: list[Refused]
    snapshot: dict


class Dead(msgspec.Struct, tag=True):
    error: str


ToCore = Add | Abort | Shutdown
FromCore = Ready | Step | Dead
