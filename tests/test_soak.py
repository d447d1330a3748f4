"""Soak: 64 concurrent clients mixing tasks for a bounded time (POOLTRITON_SOAK_S, default 60 s; set
it to 3600 for the long run), every answer checked against the answer to the same input before the
soak; no request fails, memory does not grow (RSS of the server and its stubs from warm-up to the end
< 10 %), shared memory stays flat."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from pooltriton.client import AsyncPoolingClient

from conftest import REPOSITORY, start_server
from corpus import varied_texts

SOAK_S = float(os.environ.get("POOLTRITON_SOAK_S", "60"))
CLIENTS = 64


def shm_bytes(prefix: str) -> int:
    return sum(p.stat().st_size for p in Path("/dev/shm").glob(f"{prefix}*"))


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory: pytest.TempPathFactory):
    server = start_server(REPOSITORY, tmp_path_factory.mktemp("soak") / "server.log")
    yield server
    assert server.stop() == 0


def test_soak_mixed_tasks(soak_server) -> None:
    texts = varied_texts(24, seed=11, max_words=40)

    async def run() -> dict:
        async with AsyncPoolingClient(soak_server.grpc_url, retries=1) as client:
            calls = {
                "embed": lambda i: client.embed(texts[i % 24 : i % 24 + 4]),
                "token_embed": lambda i: client.encode(texts[i % 24 : i % 24 + 2], model="minilm_tokens"),
                "token_classify": lambda i: client.encode(texts[i % 24 : i % 24 + 2], model="rampart"),
                "score": lambda i: client.score(texts[i % 24], texts[(i + 1) % 24 : (i + 1) % 24 + 3]),
            }
            expected = {(kind, i): await call(i) for kind, call in calls.items() for i in range(24)}
            counts = {"ok": 0, "wrong": 0, "failed": 0}
            samples: list[tuple[float, float, int]] = []

            async def worker(offset: int, deadline: float) -> None:
                n = offset
                while time.monotonic() < deadline:
                    kind = list(calls)[n % len(calls)]
                    i = (n // len(calls)) % 24
                    try:
                        got = await calls[kind](i)
                    except Exception:  # counted: the soak allows none
                        counts["failed"] += 1
                        continue
                    finally:
                        n += 1
                    want = expected[(kind, i)]
                    pairs = zip(got, want) if isinstance(want, list) else [(got, want)]
                    exact = all(a.shape == b.shape and np.abs(a - b).max() <= 1e-5 for a, b in pairs)
                    counts["ok" if exact else "wrong"] += 1

            async def sample(deadline: float) -> None:
                while time.monotonic() < deadline:
                    samples.append((time.monotonic(), soak_server.memory_mb(),
                                    shm_bytes(soak_server.shm_prefix)))
                    await asyncio.sleep(1)

            warm = time.monotonic() + min(10.0, SOAK_S / 4)
            await asyncio.gather(*(worker(k, warm) for k in range(CLIENTS)))  # warm-up: pools and arenas
            end = time.monotonic() + SOAK_S
            await asyncio.gather(sample(end), *(worker(k, end) for k in range(CLIENTS)))
            return {"counts": counts, "samples": samples}

    result = asyncio.run(run())
    counts, samples = result["counts"], result["samples"]
    first, last = samples[0], samples[-1]
    growth = (last[1] - first[1]) / first[1]
    print(f"\nsoak {SOAK_S:.0f} s x {CLIENTS} clients: {counts}; RSS {first[1]:.0f} -> {last[1]:.0f} MB "
          f"({growth * 100:+.1f} %), shared memory {first[2] >> 20} -> {last[2] >> 20} MiB")
    assert counts["failed"] == 0 and counts["wrong"] == 0 and counts["ok"] > 0
    assert growth < 0.10
    # Flat: at most one growth step of the Python backend's pool (shm-growth-byte-size, 1 MiB).
    assert last[2] - first[2] <= 1 << 20
