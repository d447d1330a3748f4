"""Client library for pooltriton-served models."""

from pooltriton.clients.triton import PoolingClient

__all__ = ["PoolingClient"]
