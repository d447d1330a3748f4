"""Queue sizes from measured capacity (the benchmark measures it; `export --queue-size` applies it).

A stage's queue of N requests drains in N / C seconds at capacity C requests/s. A request that would
wait longer than the queue timeout is rejected anyway, so holding more than C x timeout requests only
makes clients wait for a rejection: that product is the largest useful queue. Smaller is fine (bursts
get 503/429 sooner); Triton counts requests, not texts, so the bound depends on the request size.
"""

from __future__ import annotations

import math


def queue_size_for(requests_per_s: float, timeout_ms: int) -> int:
    """The largest queue a stage clears within `timeout_ms` at `requests_per_s` (at least 1)."""
    if requests_per_s <= 0 or timeout_ms <= 0:
        raise ValueError("capacity and timeout must be positive")
    return max(1, math.floor(requests_per_s * timeout_ms / 1000))
