"""Client library for pooltriton-served models (sync and asyncio, HTTP and gRPC to Triton), both thin
adapters of the one pooling service (`PoolingService`), which the gateway's routes use too."""

from pooltriton.client.service import ModelNotFound, Pooled, PoolingService, RequestError, RerankResult
from pooltriton.client.triton import (
    AsyncPoolingClient,
    Classification,
    ModelInfo,
    PoolingClient,
    TokenClassification,
)

__all__ = [
    "AsyncPoolingClient",
    "Classification",
    "ModelInfo",
    "ModelNotFound",
    "Pooled",
    "PoolingClient",
    "PoolingService",
    "RequestError",
    "RerankResult",
    "TokenClassification",
]
