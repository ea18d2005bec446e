"""Serving benchmark: starts `python -m server` (MTP off, then on), sends streaming
completions at several concurrencies over loopback, and prints TTFT, TPOT, ITL and E2E
(mean, p50, p99 in ms) with request and output throughput, prefix caching off (the
prompts repeat; bench/prefix.py measures the cache); beside each row, the offline
engine's output throughput on the same prompts at the same concurrency: run in this
process just before and just after the served level (the mean of the two), never while
the server works, so that the machine's drift between runs is not read as the server's.
The client is a minimal asyncio HTTP/1.1 reader (see Stream). Prints figures only.

    .venv/bin/python bench/serve.py [--model DIR] [--requests 64] [--prompt-len 256]
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.args import bench_parser  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else 0.0


class Stream:
    """One streaming POST over a fresh loopback connection, read as raw HTTP/1.1: the
    SSE events of a chunked body, each timestamped on arrival. A minimal client on
    purpose: on this 2-core machine the client shares the CPU with the engine, and a
    full HTTP library's per-event cost (several times the server's) would be measured
    as the server's. Only the final usage event is parsed as JSON."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port

    async def post(self, path: str, body: dict) -> tuple[list[float], dict]:
        """(arrival time of every event with a choice, the usage event's usage)."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + data)
        try:
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"server answered {status.decode().strip()}")
            while (await reader.readline()).strip():        # headers
                pass
            return await self._events(reader)
        finally:
            writer.close()

    @staticmethod
    async def _events(reader: asyncio.StreamReader) -> tuple[list[float], dict]:
        stamps, usage, pending = [], {}, b""
        while size := int((await reader.readline()).strip() or b"0", 16):
            pending += await reader.readexactly(size)
            await reader.readexactly(2)                             # the chunk's CRLF
            *events, pending = pending.split(b"\n\n")
            now = time.perf_counter()
            for event in events:
                if not event.startswith(b"data: {"):
                    continue
                if b'"choices": []' in event or b'"choices":[]' in event:
                    usage = json.loads(event[6:])["usage"]
                else:
                    stamps.append(now)
        return stamps, usage


async def one(client: Stream, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    stamps, usage = await client.post("/v1/completions", body)
    end = time.perf_counter()
    return {"ttft": stamps[0] - start, "e2e": end - start,
            "tokens": usage["completion_tokens"],
            "itl": [b - a for a, b in zip(stamps, stamps[1:])]}


async def level(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    host, port = url.rsplit("/", 1)[-1].split(":")
    client = Stream(host, int(port))

    async def run(p):
        async with gate:
            return await one(client, p, max_tokens)

    start = time.perf_counter()
    results = await asyncio.gather(*(run(p) for p in prompts))
    seconds = time.perf_counter() - start
    tpot = [(r["e2e"] - r["ttft"]) / max(1, r["tokens"] - 1) for r in results]
    itl = [gap for r in results for gap in r["itl"]]

    def stats(values):
        return [1e3 * statistics.fmean(values), 1e3 * percentile(values, 50),
                1e3 * percentile(values, 99)]

    return {"req/s": len(results) / seconds,
            "out tok/s": sum(r["tokens"] for r in results) / seconds,
            "ttft": stats([r["ttft"] for r in results]), "tpot": stats(tpot),
            "itl": stats(itl), "e2e": stats([r["e2e"] for r in results])}


def offline_engine(spec: str, model: Path, k: int):
    from runtime.core.config import EngineConfig
    from runtime.core.sampling_params import SamplingParams
    from runtime.engine.engine import Engine

    engine = Engine.build(EngineConfig(spec=spec, model=model, num_speculative_tokens=k,
                                       enable_prefix_caching=False))
    engine.warmup()
    engine.generate([[2] * 8], SamplingParams(temperature=0, max_tokens=4))
    return engine


def offline(engine, prompts: list[list[int]], c: int, max_tokens: int) -> float:
    """Output tokens per second of the engine itself, at most `c` requests in flight (a
    new one added as one finishes, as the served clients do)."""
    from runtime.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    queue, running, tokens = list(prompts), 0, 0
    start = time.perf_counter()
    while queue or running:
        while queue and running < c:
            engine.add_request(queue.pop(0), params)
            running += 1
        for out in engine.step():
            tokens += len(out.new_ids)
            running -= out.finished
    return tokens / (time.perf_counter() - start)


def start_server(spec: str, model: Path, port: int, k: int, *flags: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--spec", spec, "--model", str(model), "--port",
         str(port), "--num-speculative-tokens", str(k), "--served-model-name", "tiny",
         *flags],
        cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise TimeoutError("the server did not start")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    from bench.offline import prompts as make_prompts

    prompts = make_prompts(args.requests, args.prompt_len, args.model)
    print(f"{args.requests} requests, prompt {args.prompt_len} tokens, {args.max_tokens} "
          f"generated, greedy, streaming; latencies in ms (mean / p50 / p99)")
    print("| MTP | conc | req/s | out tok/s | offline tok/s | served/offline | TTFT | TPOT "
          "| ITL | E2E |\n" + "|---" * 10 + "|")
    levels = [int(x) for x in args.concurrency.split(",")]
    for k in (0, 1):
        engine = offline_engine(args.spec, args.model, k)
        proc = start_server(args.spec, args.model, args.port, k,
                            "--no-enable-prefix-caching")   # the prompts repeat: see prefix.py
        try:
            for c in levels:
                before = offline(engine, prompts, c, args.max_tokens)
                r = asyncio.run(level(f"http://127.0.0.1:{args.port}", prompts, c,
                                      args.max_tokens))
                alone = (before + offline(engine, prompts, c, args.max_tokens)) / 2
                cell = {m: " / ".join(f"{v:.0f}" for v in r[m])
                        for m in ("ttft", "tpot", "itl", "e2e")}
                print(f"| {'on' if k else 'off'} | {c} | {r['req/s']:.2f} | "
                      f"{r['out tok/s']:.1f} | {alone:.1f} | "
                      f"{r['out tok/s'] / alone:.0%} | {cell['ttft']} | {cell['tpot']} | "
                      f"{cell['itl']} | {cell['e2e']} |", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
            del engine


if __name__ == "__main__":
    main()
