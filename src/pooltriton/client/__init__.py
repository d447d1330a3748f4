"""Client library for pooltriton-served models (sync and asyncio, HTTP and gRPC to Triton)."""

from pooltriton.client.triton import (
    AsyncPoolingClient,
    Classification,
    ModelInfo,
    PoolingClient,
    RerankResult,
    TokenClassification,
)

__all__ = ["AsyncPoolingClient", "Classification", "ModelInfo", "PoolingClient", "RerankResult",
           "TokenClassification"]
