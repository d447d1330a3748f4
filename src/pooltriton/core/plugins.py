"""The `plugin` task: a user's own input/output processor around a served pooling model.

Like vLLM's IO Processor plugins. Write a small class, register it by name, and export a plugin
model that names it; the served model takes JSON-able inputs, runs `pre_process`, calls the pooling
model it wraps (its ensemble, in-process via Triton BLS), then returns what `post_process` makes of
the outputs, one JSON document per input.

    from pooltriton.core.plugins import IOProcessor, register

    @register("shout")
    class Shout(IOProcessor):
        def pre_process(self, inputs, params):
            return [text.upper() for text in inputs]

        def post_process(self, inputs, outputs, params):
            return [{"text": t, "norm": float(v @ v)} for t, v in zip(inputs, outputs["EMBEDDING"])]

    pooltriton plugin my_shout --plugin shout --module my_package.plugins --model minilm
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

_REGISTRY: dict[str, type[IOProcessor]] = {}


class IOProcessor:
    """Override one or both hooks. `params` are the request's parameters (KServe `parameters`)."""

    def pre_process(self, inputs: list[str], params: dict[str, Any]) -> list[str]:
        """Inputs as the client sent them -> the texts for the wrapped model."""
        return inputs

    def post_process(self, inputs: list[str], outputs: dict[str, np.ndarray], params: dict[str, Any]) -> list[Any]:
        """The wrapped model's outputs for those texts -> one JSON-able answer per input."""
        first = next(iter(outputs.values()))
        return [row.tolist() for row in first]


def register(name: str) -> Callable[[type[IOProcessor]], type[IOProcessor]]:
    def decorate(cls: type[IOProcessor]) -> type[IOProcessor]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"plugin {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return decorate


def get_plugin(name: str, module: str | None = None) -> IOProcessor:
    """Import `module` (which registers its plugins), then build the plugin registered as `name`."""
    if module:
        importlib.import_module(module)
    if name not in _REGISTRY:
        raise KeyError(f"no plugin registered as {name!r} (registered: {sorted(_REGISTRY)}); "
                       "is its module named with --module?")
    return _REGISTRY[name]()
