"""Work for clients that went away: gRPC clients past their deadline, and HTTP clients of the gateway
that disconnect (the gateway cancels its gRPC call). Measured on the encoder stage's own count of
computed texts (Triton's metrics port), against a real server; loopback, bounded.

Triton 2.51 drops a cancelled ensemble request only between its steps: a step request already queued
at the encoder is computed (its `is_cancelled()` stays false; triton-inference-server/server#6739),
so on a fast host, where the tokenizer step clears a whole flood within its clients' 0.3 s, a
cancellation alone saved nothing (24 of 24 computed, measured). What drops queued work on every host
is Triton's own request timeout (tritonclient's `timeout`, which each step's queue policy applies):
a client with a deadline sends it too.
"""

from __future__ import annotations

import asyncio
import glob
import re
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from pooltriton.client import AsyncPoolingClient
from pooltriton.contract import TEXT
from pooltriton.contract.admission import MIN_ANSWERS, retry_after_in
from pooltriton.contract.requests import text_array

from conftest import running_gateway

REQUESTS, TEXTS = 24, 32  # each 0.3-0.7 s of encoder time: 7-17 s if all were computed
DEADLINE_S = 0.3


def _texts() -> list[str]:
    from bench.bench import corpus

    return corpus(TEXTS, seed=11)


def _encoded(server) -> float:
    """Texts the minilm encoder has computed so far."""
    return _metric(server, "nv_inference_count")


def _once_admitted(call, bound_s: float = 90.0):
    """`call()` once the server admits it: right after a flood the tokenizer may still count the accepted
    work as queued and refuse, retryably and with a hint (a slow host clears it later); an error without
    a hint, or refusals past the bound, fail the test."""
    give_up = time.monotonic() + bound_s
    while True:
        try:
            return call()
        except Exception as error:
            response = getattr(error, "response", None)
            hint = (float(response.headers.get("retry-after", "1")) if response is not None
                    and response.status_code == 429 else retry_after_in(str(error)))
            if hint is None or time.monotonic() > give_up:
                raise
            time.sleep(min(max(hint, 0.5), 5.0))


def _metric(server, name: str, model: str = "minilm_encoder") -> float:
    text = httpx.get(server.metrics_url, timeout=10).text
    match = re.search(rf'^{name}\{{model="{model}",version="1"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _settled(server, client, timeout: float = 90) -> float:
    """The encoder's count once it has finished what was sent before: no request left in a queue, then
    one more text through the encoder's one instance, which runs after any batch still executing
    (Triton's pending count leaves that out; the count moves only when a batch ends, ~1 s for four
    requests: an earlier version, stopping after a quiet second, read it mid-flood). The count includes
    that text."""
    deadline = time.monotonic() + timeout
    while sum(_metric(server, "nv_inference_pending_request_count", model)
              for model in ("minilm", "minilm_tokenizer", "minilm_encoder")) > 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"requests still queued {timeout} s after the flood")
        time.sleep(0.5)
    _once_admitted(lambda: client.embed(["settled"]))
    return _encoded(server)


@pytest.mark.parametrize("caller", ["tritonclient", "pooltriton"])
def test_grpc_requests_past_their_deadline_are_not_computed(server, grpc_client, minilm_st, caller: str) -> None:
    """With Triton's request timeout beside the client's deadline, a request that waited in the
    encoder's queue longer than the timeout is dropped there (each stage's queue counts it from the
    request's arrival). The tokenizer passes the flood on within ~0.1 s; the idle encoder takes one
    request at once, and when that ends (0.3-0.7 s) the four it takes next have waited about that long:
    1-5 of 24 requests run on these hosts (measured: 1 and 3), where a batch of four takes longer than
    the timeout. Without the timeout all 24 ran on a fast host. Callers: tritonclient given both, and
    our client given `timeout_s` (one attempt: the test's flood, not retries)."""
    texts = _texts()
    grpc_client.embed(texts[:1])  # warm
    before = _settled(server, grpc_client)

    async def flood() -> list[str]:
        ours = AsyncPoolingClient(server.grpc_url, "grpc", retries=1, timeout_s=DEADLINE_S)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            async def one() -> str:
                inputs = [grpcclient.InferInput(TEXT, [TEXTS, 1], "BYTES")]
                inputs[0].set_data_from_numpy(text_array(texts, batched=True))
                try:
                    if caller == "pooltriton":
                        await ours.embed(texts, model="minilm")
                    else:
                        await client.infer("minilm", inputs, client_timeout=DEADLINE_S, timeout=int(DEADLINE_S * 1e6))
                    return "ok"
                except InferenceServerException as error:  # or refused at once by admission by work
                    if "Request timeout expired" in str(error):
                        return "timed out"  # Triton's timeout, as the client's own
                    return "refused" if retry_after_in(str(error)) is not None else str(error.status())

            await ours.info("minilm")  # its config read before the flood, outside the deadline
            return await asyncio.gather(*(one() for _ in range(REQUESTS)))
        finally:
            await client.close()
            await ours.close()

    outcomes = asyncio.run(flood())
    assert sum(outcomes.count(o) for o in ("StatusCode.DEADLINE_EXCEEDED", "timed out", "refused")) >= REQUESTS - 2, \
        outcomes
    computed = _settled(server, grpc_client) - before - 1  # less the settling text
    # Without the timeout all REQUESTS x TEXTS texts were computed after their clients left (fast host).
    assert computed <= REQUESTS * TEXTS / 4, (computed, REQUESTS * TEXTS)
    # ... and the server answers exactly afterwards.
    np.testing.assert_allclose(_once_admitted(lambda: grpc_client.embed(texts[:4])),
                               minilm_st.encode(texts[:4], normalize_embeddings=True), atol=1e-5)


ABANDONING, STEADY, ABANDONED_EACH = 6, 4, 20  # clients; requests each abandoning client sends


def test_work_triton_dropped_by_its_timeout_no_longer_counts_against_other_clients(
        server, grpc_client, minilm_st) -> None:
    """Six clients send requests of 32 texts with a 50 ms Triton timeout (gone at 0.3 s), nearly all
    dropped at the encoder's queue (a batch there takes longer), while four steady clients without one
    keep sending theirs. What is really queued stays far below the 30 s deadline's 24 s budget (~12 s
    on the slowest host measured: 14 requests of 0.7 s), so no request may be refused. Admission by work
    counted each dropped request as queued until the encoder idled, which the steady clients never let
    it: it refused most requests of both kinds (264 of 283 steady ones in a 20 s run; here 60-67 of 120
    abandoning ones, measured before the fix). The tokenizers' log of admitted requests forgets what was
    not started within its timeout (backends.workboard)."""
    texts = _texts()
    reference = minilm_st.encode(texts, normalize_embeddings=True, batch_size=32)
    _settled(server, grpc_client)
    for _ in range(int(MIN_ANSWERS) + 2):  # the encoder's rate measured, as admission needs to refuse at all
        grpc_client.embed(texts)

    def inputs(batch: list[str]) -> list:
        tensor = grpcclient.InferInput(TEXT, [len(batch), 1], "BYTES")
        tensor.set_data_from_numpy(text_array(batch, batched=True))
        return [tensor]

    async def run() -> tuple[list[str], list[object]]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        abandoned: list[str] = []
        steady: list[object] = []
        left = [ABANDONING]

        async def abandoning() -> None:
            for _ in range(ABANDONED_EACH):
                try:
                    await client.infer("minilm", inputs(texts), timeout=50_000, client_timeout=0.3)
                    abandoned.append("ok")
                except InferenceServerException as error:
                    abandoned.append("refused" if retry_after_in(str(error)) is not None else "dropped")
            left[0] -= 1

        async def steady_client() -> None:
            while left[0]:  # for as long as requests are being abandoned; one refusal ends it
                try:
                    steady.append((await client.infer("minilm", inputs(texts))).as_numpy("EMBEDDING"))
                except InferenceServerException as error:
                    steady.append(error)
                    return

        try:
            await asyncio.gather(*(abandoning() for _ in range(ABANDONING)), *(steady_client() for _ in range(STEADY)))
        finally:
            await client.close()
        return abandoned, steady

    abandoned, steady = asyncio.run(run())
    refused = [str(answer) for answer in steady if isinstance(answer, Exception)]
    print(f"\nabandoning clients: {abandoned.count('dropped')} dropped, {abandoned.count('ok')} answered, "
          f"{abandoned.count('refused')} refused; steady clients: {len(steady) - len(refused)} answered")
    assert not refused and "refused" not in abandoned, (refused, abandoned)
    # Enough work admitted and then dropped to fill the budget twice over or more (~0.3-0.7 s each).
    assert abandoned.count("dropped") >= ABANDONING * ABANDONED_EACH // 2, abandoned
    assert len(steady) >= STEADY
    for vectors in steady:
        np.testing.assert_allclose(vectors, reference, atol=1e-5)
    # Every request the encoder started left the log by its tokens (the stages count them alike), and
    # the settling text's admission swept out the dropped ones: nothing is left on it.
    _settled(server, grpc_client)
    assert not _logged(server).any()


def _logged(server) -> np.ndarray:
    """The tokens of each entry on minilm's admission log (backends.workboard), 0 where free."""
    from pooltriton.backends.workboard import ENTRY, LOG, ROWS_SIZE, TOKENS

    (path,) = glob.glob(f"/dev/shm/{server.shm_prefix}work*_minilm_encoder")
    return np.fromfile(path, dtype=np.float64, offset=ROWS_SIZE).reshape(LOG, ENTRY)[:, TOKENS]


def test_gateway_cancels_the_triton_calls_of_disconnected_clients(server, grpc_client, minilm_st) -> None:
    """Each handler whose client left is cancelled with its gRPC call (counted as 499). What that saves
    inside Triton depends on the host's speed (module docstring): an HTTP client's disconnect is no
    deadline Triton could apply, so the encoder's count is not bounded here, only waited for."""
    texts = _texts()
    # No admission by work at the gateway here: the test is about requests that were accepted and then
    # abandoned (Triton's own may still refuse part of the flood, counted as such).
    with running_gateway(server.grpc_url, admin_key=server.admin_key, deadline_s=None) as url:
        _once_admitted(lambda: httpx.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": texts[:1]},
                                          timeout=60).raise_for_status())

        async def flood() -> list[str]:
            async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
                async def one() -> str:
                    try:
                        answer = await client.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": texts})
                        # Triton's own admission by work (the tokenizer stage) may refuse part of it at once.
                        return "refused" if answer.status_code == 429 else "ok"
                    except httpx.TimeoutException:
                        return "gone"  # httpx closes the connection on its timeout

                return await asyncio.gather(*(one() for _ in range(REQUESTS)))

        outcomes = asyncio.run(flood())
        # Refused at once (2-15 of 24 here, after the floods above) or abandoned: none answered in 0.3 s.
        gone = outcomes.count("gone")
        assert gone + outcomes.count("refused") >= REQUESTS - 2 and gone >= REQUESTS // 4, outcomes
        _settled(server, grpc_client)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        closed = re.search(r'requests_total\{route="/v1/embeddings",status="499"\} (\d+)', metrics)
        assert closed and int(closed.group(1)) >= gone - 2, metrics  # every client gone, counted
        answer = _once_admitted(lambda: httpx.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": texts[:4]},
                                                   timeout=60).raise_for_status()).json()
        vectors = np.array([d["embedding"] for d in answer["data"]])
        np.testing.assert_allclose(vectors, minilm_st.encode(texts[:4], normalize_embeddings=True), atol=1e-5)
