"""Prefix-caching benchmark: multi-turn chat against `python -m server`, with the cache
on and then off (--no-enable-prefix-caching), one server at a time.

16 conversations run at once, 4 turns each; every turn re-sends the whole history (the
earlier user messages and the assistant's answers) plus a new user message, streamed
over /v1/chat/completions with usage. Prints, per server, the TTFT of turn 1 and of turns
2-4 (mean / p50 / p99 in ms) and the hit rate: the cached prompt tokens the server
reports (usage.prompt_tokens_details.cached_tokens) over the tokens re-sent, i.e. the
previous turn's prompt and answer, for turns 2-4. Then the ratio of the two TTFTs.
Messages are openings of held-out standard-library files (what the embedded model knows).

    .venv/bin/python bench/prefix.py [--conversations 16] [--turns 4] [--first-len 1000]
"""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.args import bench_parser  # noqa: E402
from bench.serve import Stream, percentile, start_server  # noqa: E402


class ChatStream(Stream):
    """Stream that also keeps the answer's text (every content delta)."""

    async def chat(self, body: dict) -> tuple[float, str, dict]:
        """(seconds to the first content, the answer, usage)."""
        self.text, start = [], time.perf_counter()
        stamps, usage = await self.post("/v1/chat/completions", body)
        return stamps[0] - start, "".join(self.text), usage

    async def _events(self, reader: asyncio.StreamReader) -> tuple[list[float], dict]:
        stamps, usage, pending = [], {}, b""
        while size := int((await reader.readline()).strip() or b"0", 16):
            pending += await reader.readexactly(size)
            await reader.readexactly(2)
            *events, pending = pending.split(b"\n\n")
            now = time.perf_counter()
            for event in events:
                if not event.startswith(b"data: {"):
                    continue
                data = json.loads(event[6:])
                if data.get("usage"):
                    usage = data["usage"]
                for choice in data["choices"]:
                    content = choice["delta"].get("content")
                    if content:
                        self.text.append(content)
                        stamps.append(now)
        return stamps, usage


def messages(conversations: int, turns: int, first_len: int, later_len: int,
             model: Path) -> list[list[str]]:
    """Per conversation, the user message of every turn: held-out file openings."""
    from bench.train_tiny import corpus_files, split
    from runtime.text.tokenizer import Tokenizer

    tok = Tokenizer(model)
    texts = [t for t in (f.read_text(errors="replace") for f in split(corpus_files())[1])
             if len(tok.encode(t)) >= first_len + turns * later_len]

    def cut(text: str, start: int, length: int) -> str:
        return tok.decode(tok.encode(text)[start:start + length])

    return [[cut(texts[c % len(texts)], 0, first_len)]
            + [cut(texts[(c + t) % len(texts)], first_len, later_len) for t in range(1, turns)]
            for c in range(conversations)]


async def conversation(client: ChatStream, users: list[str], max_tokens: int) -> list[dict]:
    history, turns, sent = [], [], 0
    for user in users:
        history.append({"role": "user", "content": user})
        body = {"model": "tiny", "messages": history, "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        ttft, answer, usage = await client.chat(body)
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        turns.append({"ttft": ttft, "cached": cached, "resent": sent})
        history.append({"role": "assistant", "content": answer})
        sent = usage["prompt_tokens"] + usage["completion_tokens"]
    return turns


async def run(port: int, convs: list[list[str]], max_tokens: int) -> list[list[dict]]:
    return await asyncio.gather(*(conversation(ChatStream("127.0.0.1", port), users,
                                               max_tokens) for users in convs))


def report(label: str, results: list[list[dict]]) -> float:
    def ms(values):
        return " / ".join(f"{1e3 * v:.0f}" for v in (statistics.fmean(values),
                                                      percentile(values, 50),
                                                      percentile(values, 99)))

    first = [c[0]["ttft"] for c in results]
    later = [t["ttft"] for c in results for t in c[1:]]
    cached = sum(t["cached"] for c in results for t in c[1:])
    resent = sum(t["resent"] for c in results for t in c[1:])
    print(f"| {label} | {ms(first)} | {ms(later)} | {cached} / {resent} = "
          f"{cached / resent:.1%} |", flush=True)
    return statistics.fmean(later)


def main() -> None:
    parser = bench_parser(__doc__, max_tokens=32, prompt_len=None)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--first-len", type=int, default=1000,
                        help="tokens of the first user message")
    parser.add_argument("--later-len", type=int, default=150,
                        help="tokens of each later user message")
    parser.add_argument("--port", type=int, default=8124)
    args = parser.parse_args()
    convs = messages(args.conversations, args.turns, args.first_len, args.later_len,
                     args.model)
    print(f"{args.conversations} conversations x {args.turns} turns at once; turn 1 "
          f"~{args.first_len} tokens, each later turn re-sends the history plus "
          f"~{args.later_len}; {args.max_tokens} generated per turn, greedy, streaming")
    print("| prefix caching | TTFT turn 1 (ms: mean / p50 / p99) | TTFT turns 2-4 | "
          "cached / re-sent tokens, turns 2-4 |\n|---|---|---|---|")
    means = {}
    for label, flags in (("on", []), ("off", ["--no-enable-prefix-caching"])):
        proc = start_server(args.spec, args.model, args.port, 1, *flags)
        try:
            means[label] = report(label, asyncio.run(run(args.port, convs, args.max_tokens)))
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    print(f"\nmean TTFT of turns 2-4, cached / uncached: {means['on'] / means['off']:.0%}")


if __name__ == "__main__":
    main()
