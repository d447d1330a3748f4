"""Triton's dynamic batcher merges concurrent single-text requests of different lengths."""

from __future__ import annotations

import asyncio

import numpy as np
import tritonclient.grpc.aio as aiogrpc

from corpus import varied_texts


def model_counts(client_stats, name: str) -> tuple[int, int]:
    for stats in client_stats.model_stats:
        if stats.name == name:
            return int(stats.inference_count), int(stats.execution_count)
    raise KeyError(name)


async def _fire(url: str, texts: list[str],
                headers: dict[str, str]) -> tuple[list[np.ndarray], dict[str, tuple[int, int]]]:
    client = aiogrpc.InferenceServerClient(url)
    names = ("minilm_tokenizer", "minilm_encoder")
    before = await client.get_inference_statistics(headers=headers)

    async def one(text: str) -> np.ndarray:
        tensor = aiogrpc.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=object).reshape(1, 1))
        result = await client.infer("minilm", [tensor])
        return result.as_numpy("EMBEDDING")

    vectors = await asyncio.gather(*(one(t) for t in texts))
    # A stage reports a batch's statistics after it has sent the batch's answers, so the last batch may
    # not be counted yet when its answers arrive: read until every answered request is (bounded).
    for _ in range(100):
        after = await client.get_inference_statistics(headers=headers)
        deltas = {}
        for name in names:
            inferences_0, executions_0 = model_counts(before, name)
            inferences_1, executions_1 = model_counts(after, name)
            deltas[name] = (inferences_1 - inferences_0, executions_1 - executions_0)
        if all(inferences >= len(texts) for inferences, _ in deltas.values()):
            break
        await asyncio.sleep(0.1)
    await client.close()
    return vectors, deltas


def test_concurrent_varied_length_requests_are_batched(server, http_client) -> None:
    texts = varied_texts(64, seed=3, max_words=60)
    vectors, deltas = asyncio.run(_fire(server.grpc_url, texts, server.admin_headers("grpc")))
    inferences, executions = deltas["minilm_encoder"]
    assert inferences == len(texts)
    assert executions < len(texts), f"encoder ran {executions} executions for {len(texts)} requests"
    tok_inferences, tok_executions = deltas["minilm_tokenizer"]
    assert tok_inferences == len(texts) and tok_executions < len(texts)
    # Batching changed nothing in the answers.
    expected = http_client.embed(texts)
    np.testing.assert_allclose(np.concatenate(vectors), expected, atol=1e-5)
