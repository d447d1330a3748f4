"""Scoring functions over pooled outputs (numpy), shared by the scorer backend and the tests' references."""

from __future__ import annotations

import numpy as np


def pair_up(queries: int, documents: int) -> np.ndarray:
    """Query index for each document: 1:1 and 1:N broadcast the single query, N:N zips."""
    if queries == 1:
        return np.zeros(documents, dtype=np.int64)
    if queries == documents:
        return np.arange(documents)
    raise ValueError(
        f"{queries} queries and {documents} documents: send one query (1:1, 1:N) or as many queries as "
        "documents (N:N, zipped)"
    )


def cosine(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Row-wise cosine of paired vectors (bi-encoder score)."""
    norms = np.linalg.norm(queries, axis=-1) * np.linalg.norm(documents, axis=-1)
    return (np.sum(queries * documents, axis=-1) / np.maximum(norms, 1e-12)).astype(np.float32)


def maxsim(query_tokens: np.ndarray, document_tokens: np.ndarray) -> float:
    """Late interaction: sum over query tokens of the best dot product with any document token."""
    return float((query_tokens @ document_tokens.T).max(axis=1).sum())


def split_tokens(flat: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Undo the token-task output layout: [T, C] + counts [n, 1] -> n arrays of [count_i, C]."""
    return np.split(flat, np.cumsum(counts.reshape(-1))[:-1])
