"""The gateway's own Prometheus metrics (`/metrics`), beside Triton's on its metrics port.

Written by prometheus_client (escaping and the text format are its job). Routes are labelled by their
template, never the raw path: every path a client or a scanner sends that no route matches is counted
under one label, so the number of series is bounded by the app's routes and status codes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from starlette.routing import Match

# Seconds: single texts answer in milliseconds, a full batch of long texts in seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Requests per call to Triton (client.coalesce): 1 when each travels alone.
MERGED_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The status nginx logs for a request whose client closed the connection before the answer.
CLIENT_CLOSED = 499
UNMATCHED = "unmatched"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# No `_created` series beside each counter and histogram: half the samples, nothing a dashboard reads.
disable_created_metrics()


def route_label(scope: dict) -> str:
    """The matched route's template (`/v1/embeddings`); requests answered before routing (401, 413)
    are matched here against the app's routes; anything else is UNMATCHED."""
    route = scope.get("route")
    if route is None and scope.get("app") is not None:
        route = next((r for r in _routes(scope["app"].router.routes) if r.matches(scope)[0] is Match.FULL), None)
    return getattr(route, "path", None) or UNMATCHED


def _routes(routes: list) -> Iterator:
    """Every route, those of included routers too (FastAPI keeps an included router as one entry)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _routes(included.routes)
        else:
            yield route


class GatewayMetrics:
    def __init__(self) -> None:
        # One registry per app, so two gateways in one process (tests) count apart.
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("pooltriton_gateway_requests", "Requests by route and status (499: client went away).",
                                ("route", "status"), registry=self.registry)
        self.duration = Histogram("pooltriton_gateway_request_duration_seconds",
                                  "Time from request to response, by route.", ("route",), buckets=BUCKETS,
                                  registry=self.registry)
        self.requests_per_call = Histogram("pooltriton_gateway_requests_per_triton_call",
                                           "Encode requests carried by each call to Triton (merged when concurrent).",
                                           buckets=MERGED_BUCKETS, registry=self.registry)

    def observe(self, scope: dict, status: int, seconds: float) -> None:
        route = route_label(scope)
        self.requests.labels(route, str(status)).inc()
        self.duration.labels(route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
