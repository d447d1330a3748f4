"""The gateway's own Prometheus metrics (`/metrics`), beside Triton's on its metrics port."""

from __future__ import annotations

import bisect
from collections import defaultdict

# Seconds: single texts answer in milliseconds, a full batch of long texts in seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The status nginx logs for a request whose client closed the connection before the answer.
CLIENT_CLOSED = 499


class GatewayMetrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        # Per route: cumulative-bucket counts (last one +Inf), sum of seconds.
        self.buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.seconds: dict[str, float] = defaultdict(float)

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        counts = self.buckets[route]
        for i in range(bisect.bisect_left(BUCKETS, seconds), len(counts)):
            counts[i] += 1
        self.seconds[route] += seconds

    def render(self) -> str:
        lines = ["# HELP pooltriton_gateway_requests_total Requests by route and status (499: client went away).",
                 "# TYPE pooltriton_gateway_requests_total counter"]
        lines += [f'pooltriton_gateway_requests_total{{route="{route}",status="{status}"}} {count}'
                  for (route, status), count in sorted(self.requests.items())]
        name = "pooltriton_gateway_request_duration_seconds"
        lines += [f"# HELP {name} Time from request to response, by route.", f"# TYPE {name} histogram"]
        for route, counts in sorted(self.buckets.items()):
            bounds = [*(str(b) for b in BUCKETS), "+Inf"]
            lines += [f'{name}_bucket{{route="{route}",le="{le}"}} {n}' for le, n in zip(bounds, counts)]
            lines += [f'{name}_sum{{route="{route}"}} {self.seconds[route]}',
                      f'{name}_count{{route="{route}"}} {counts[-1]}']
        return "\n".join(lines) + "\n"
