"""Activations the pooler backend applies (numpy; one function per activation, picked by name)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pooltriton.core.semantics import Activation


def normalize(x: np.ndarray) -> np.ndarray:
    # Same epsilon as torch.nn.functional.normalize (what sentence-transformers' Normalize uses).
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def identity(x: np.ndarray) -> np.ndarray:
    return x


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


ACTIVATIONS: dict[Activation, Callable[[np.ndarray], np.ndarray]] = {
    Activation.NORMALIZE: normalize,
    Activation.SOFTMAX: softmax,
    Activation.SIGMOID: sigmoid,
    Activation.IDENTITY: identity,
    Activation.RELU: relu,
}


def apply_activation(x: np.ndarray, activation: Activation | str, enabled: bool = True) -> np.ndarray:
    """`enabled=False` is vLLM's use_activation=false: raw logits / unnormalised vectors."""
    if not enabled:
        return x
    return ACTIVATIONS[Activation(activation)](x.astype(np.float32, copy=False)).astype(np.float32, copy=False)
