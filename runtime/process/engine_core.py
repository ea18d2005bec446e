"""The engine core: the scheduler and the model runner in a busy loop, in a process of
their own, so that no API-server work (HTTP, JSON, tokenization, detokenization, SSE)
takes the interpreter from a step.

    python -m runtime.process.engine_core --config JSON --input ADDR --output ADDR --parent PID

It pulls Add / Abort / Shutdown from --input into its Intake (runtime/engine/intake.py:
a body's requests are added a step's share at a time) and pushes, per step, one Step
message (the deltas, the refusals, the metrics snapshot) to --output; see
core_messages.py. Ready is
sent once the engine is built and warmed up (graphs loaded; missing ones compile in a
background process meanwhile). When the shared step fails it sends Dead and exits 1; it
exits when its parent does, whatever killed the parent.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import traceback

import msgspec
import zmq

from runtime.core.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.intake import Intake
from runtime.executor.parent_watch import die_with_parent
from runtime.process.core_messages import Dead, Ready, Refused, Shutdown, Step, ToCore
from runtime.process.precompile import compile_missing

log = logging.getLogger("v4serve.core")
IDLE_POLL_MS = 500


class EngineCore:
    def __init__(self, engine: Engine, inbox: zmq.Socket, outbox: zmq.Socket):
        self.engine, self.inbox, self.outbox = engine, inbox, outbox
        self.encoder, self.decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ToCore)
        limits = engine.admission.limits
        self.intake = Intake(engine, limits.max_num_seqs, limits.max_num_batched_tokens)
        self.refused: list[Refused] = []

    def run(self) -> None:
        """Steps while there is work; waits for messages when there is none. Returns on
        Shutdown; raises what a step raised."""
        while True:
            taken = self._take(block=not (self.engine.has_unfinished() or self.intake.pending))
            if taken is None:
                return
            message = self.step(taken)
            if message is not None:
                self.outbox.send(message, copy=False)

    def step(self, taken: int = 0) -> bytes | None:
        """One engine step (if there is work; the intake's next requests added first) as
        the Step message to send: its deltas, the refusals since the last one, the
        metrics; None when there is nothing to say (no delta, no refusal, and no message
        `taken` since the last step)."""
        self.refused += self.intake.admit()
        deltas = self.engine.step_deltas() if self.engine.has_unfinished() else []
        if not (deltas or taken or self.refused):   # an abort alone changes the metrics too
            return None
        message = self.encoder.encode(Step(deltas, self.refused, self.engine.snapshot()))
        self.refused = []
        return message

    def _take(self, block: bool) -> int | None:
        """Apply every message waiting (after waiting for one if `block`); how many, or
        None on Shutdown."""
        if block and not self.inbox.poll(IDLE_POLL_MS):
            return 0
        taken = 0
        while self.inbox.poll(0):
            message = self.decoder.decode(self.inbox.recv(copy=False))
            taken += 1
            if isinstance(message, Shutdown):
                return None
            self.intake.put(message)
        return taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.process.engine_core",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="EngineConfig fields as JSON")
    parser.add_argument("--input", required=True, help="ZMQ address to pull requests from")
    parser.add_argument("--output", required=True, help="ZMQ address to push outputs to")
    parser.add_argument("--parent", type=int, required=True, help="exit when this pid does")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    inbox.connect(args.input)
    outbox.connect(args.output)
    outbox.setsockopt(zmq.LINGER, 5000)
    encoder = msgspec.msgpack.Encoder()
    compiling, engine = None, None
    try:
        engine = Engine.build(EngineConfig(**json.loads(args.config)), outputs=False)
        engine.warmup()
        compiling = compile_missing(engine)
        gc.collect()              # the engine, its weights and modules leave the collector's
        gc.freeze()               # scans: a body's 16k requests trigger full collections
        outbox.send(encoder.encode(Ready(engine.summary(), engine.snapshot())))
        EngineCore(engine, inbox, outbox).run()
        return 0
    except Exception as exc:  # noqa: BLE001 - reported to the server, then exit
        traceback.print_exc()
        outbox.send(encoder.encode(Dead(f"{type(exc).__name__}: {exc}")))
        return 1
    finally:
        if compiling is not None and compiling.poll() is None:
            compiling.terminate()
        if engine is not None:
            engine.close()                   # rank workers (mp), every one reaped
        context.destroy(linger=5000)


if __name__ == "__main__":
    sys.exit(main())
