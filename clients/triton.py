"""Python client for the served pooling models, over Triton's HTTP or gRPC protocol (tritonclient).

    client = PoolingClient("localhost:8001", protocol="grpc")
    vectors = client.embed(["A man is eating food."])   # np.ndarray [1, 384], L2-normalised

Big inputs are split into requests of at most `max_batch` texts and reassembled in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}
MAX_BATCH = 128  # the exported models' max_batch_size


class PoolingClient:
    def __init__(self, url: str | None = None, protocol: str = "http", model: str = "minilm",
                 max_batch: int = MAX_BATCH, timeout_s: float = 60.0) -> None:
        if protocol == "http":
            import tritonclient.http as client_module

            self._client = client_module.InferenceServerClient(url or DEFAULT_URLS["http"],
                                                               network_timeout=timeout_s)
        elif protocol == "grpc":
            import tritonclient.grpc as client_module

            self._client = client_module.InferenceServerClient(url or DEFAULT_URLS["grpc"])
        else:
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        self._module = client_module
        self.protocol, self.model, self.max_batch = protocol, model, max_batch
        self._outputs: dict[str, str] = {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PoolingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def output_name(self, model: str) -> str:
        """The model's single public output (EMBEDDING, PROBABILITIES, ...), from its metadata."""
        if model not in self._outputs:
            metadata = self._client.get_model_metadata(model)
            outputs = metadata["outputs"] if isinstance(metadata, dict) else metadata.outputs
            first = outputs[0]
            self._outputs[model] = first["name"] if isinstance(first, dict) else first.name
        return self._outputs[model]

    def embed(self, texts: str | Sequence[str], *, model: str | None = None, truncate: str | None = None,
              use_activation: bool | None = None) -> np.ndarray:
        """One vector per text, [n, dim] float32. `truncate`: None/"NONE" rejects over-length texts
        with an error naming the limit; "END" or "START" cuts them to the model's limit."""
        return self.infer_texts(texts, model=model, truncate=truncate, use_activation=use_activation)

    def infer_texts(self, texts: str | Sequence[str], *, model: str | None = None, **options: Any) -> np.ndarray:
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch:
            raise ValueError("texts is empty: pass at least one text")
        model = model or self.model
        name = self.output_name(model)
        parameters = {k: v for k, v in options.items() if v is not None}
        parts = [self._infer(model, batch[i : i + self.max_batch], name, parameters)
                 for i in range(0, len(batch), self.max_batch)]
        return np.concatenate(parts, axis=0)

    def _infer(self, model: str, texts: list[str], output: str, parameters: dict[str, Any]) -> np.ndarray:
        data = np.array([t.encode("utf-8") if isinstance(t, str) else t for t in texts], dtype=object)
        tensor = self._module.InferInput("TEXT", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(data.reshape(-1, 1))
        result = self._client.infer(model, [tensor], outputs=[self._module.InferRequestedOutput(output)],
                                    parameters=parameters or None)
        return result.as_numpy(output)
