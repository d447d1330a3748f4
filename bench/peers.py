"""Short texts through any OpenAI-compatible embeddings server, measured as `make bench` measures the
gateway: 64 clients x 1 short text (throughput, latency percentiles), then one idle text at a time.

    python bench/peers.py --url http://127.0.0.1:8080 --model minilm [--model minilm_bf16]
    python bench/peers.py --url http://127.0.0.1:7997 --model all-MiniLM-L6-v2   # infinity, --url-prefix /v1

Run each server alone on an otherwise idle machine, one after the other (docs/performance.md, "Peers").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench import PAUSE_S, percentiles, short_corpus, through_gateway


async def idle_latency(base_url: str, texts: list[str], model: str) -> dict[str, float]:
    """One text at a time, paused as bench's idle series is."""
    import aiohttp

    times = []
    async with aiohttp.ClientSession() as http:
        for text in texts:
            await asyncio.sleep(PAUSE_S)
            started = time.perf_counter()
            async with http.post(f"{base_url}/v1/embeddings", json={"model": model, "input": [text]}) as answer:
                answer.raise_for_status()
                await answer.read()
            times.append(time.perf_counter() - started)
    return percentiles(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's base URL (it serves /v1/embeddings)")
    parser.add_argument("--model", action="append", required=True, help="a served model name (repeatable)")
    parser.add_argument("--texts", type=int, default=2000, help="short texts for the 64-client run")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients, one text each")
    parser.add_argument("--label", default="", help="what the server is, for the printed line")
    args = parser.parse_args(argv)
    texts = short_corpus(args.texts)
    for model in args.model:
        loaded = asyncio.run(through_gateway(args.url, texts, args.clients, model))
        idle = asyncio.run(idle_latency(args.url, short_corpus(100, seed=3), model))
        print(json.dumps({"server": args.label or args.url, "model": model, "clients": args.clients,
                          "texts_per_s": round(loaded["texts_per_s"], 1), "p50_ms": round(loaded["p50_ms"], 1),
                          "p99_ms": round(loaded["p99_ms"], 1), "idle_p50_ms": round(idle["p50_ms"], 2),
                          "idle_p99_ms": round(idle["p99_ms"], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
