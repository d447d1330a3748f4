"""Overload against a real server with a small queue: every request either succeeds with the exact
answer or is rejected at once (UNAVAILABLE over gRPC; 429 with Retry-After from the gateway), nothing
waits past the queue timeout plus a batch, and the server serves exact answers afterwards.

Bounded: a fixed number of requests from a fixed number of concurrent clients, loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time

import httpx
import numpy as np
import pytest

from pooltriton.client import AsyncPoolingClient, PoolingClient
from pooltriton.contract import stages
from pooltriton.contract.admission import MIN_ANSWERS
from pooltriton.contract.requests import classify
from pooltriton.export.defaults import exported_defaults

from conftest import REPOSITORY, edit_config, running_gateway, start_server

QUEUE_SIZE, TIMEOUT_S = 2, 5
MIN_ANSWERS_HERE = int(MIN_ANSWERS) + 2  # encoder batches measured before admission refuses
CLIENTS, REQUESTS = 24, 72  # each request: 32 texts of ~100 tokens, ~0.7 s of encoder time here
CALLERS = 8  # scorer and plugin instances: BLS calls into the ensemble at once


@pytest.fixture(scope="module")
def small_queue(tmp_path_factory: pytest.TempPathFactory):
    """minilm as exported by default, with queues of QUEUE_SIZE requests and a TIMEOUT_S timeout."""
    repository = tmp_path_factory.mktemp("small_queue")
    assert "minilm" in exported_defaults()
    for stage in (*stages("minilm"), "minilm_zero_shot"):
        if (REPOSITORY / stage).is_dir():
            shutil.copytree(REPOSITORY / stage, repository / stage)
    def small(message) -> None:
        if message.HasField("dynamic_batching") and message.backend not in ("scorer", "plugin"):
            policy = message.dynamic_batching.default_queue_policy
            policy.max_queue_size, policy.default_timeout_microseconds = QUEUE_SIZE, TIMEOUT_S * 10**6
        if message.backend in ("scorer", "plugin"):
            # Enough callers in flight to overflow the ensemble's queue behind them.
            for group in message.instance_group:
                group.count = CALLERS

    for config in repository.glob("*/config.pbtxt"):
        edit_config(config, small)
    server = start_server(repository, repository / "server.log")
    yield server
    assert server.stop() == 0


def _texts() -> list[str]:
    from bench.bench import corpus

    return corpus(32, seed=5)


def test_overload_is_rejected_fast_and_answers_stay_exact(small_queue, minilm_st) -> None:
    texts = _texts()
    reference = minilm_st.encode(texts, normalize_embeddings=True, batch_size=32)

    async def flood() -> list[tuple[str, float, object]]:
        outcomes: list[tuple[str, float, object]] = []
        queue = list(range(REQUESTS))
        async with AsyncPoolingClient(small_queue.grpc_url, retries=1) as client:
            await client.info("minilm")

            async def worker() -> None:
                while queue:
                    queue.pop()
                    started = time.monotonic()
                    try:
                        vectors = await client.embed(texts)
                        outcomes.append(("ok", time.monotonic() - started, vectors))
                    except Exception as error:  # classified below: only overload is acceptable
                        outcomes.append(("rejected", time.monotonic() - started, classify(error)))

            await asyncio.gather(*(worker() for _ in range(CLIENTS)))
        return outcomes

    outcomes = asyncio.run(flood())
    ok = [o for o in outcomes if o[0] == "ok"]
    rejected = [o for o in outcomes if o[0] == "rejected"]
    assert len(outcomes) == REQUESTS and ok and rejected, (len(ok), len(rejected))
    assert all(failure.status == 503 for _, _, failure in rejected), {f.message for _, _, f in rejected}
    for _, _, vectors in ok:
        assert np.abs(vectors - reference).max() <= 1e-5
    fast = sorted(seconds for _, seconds, _ in rejected)
    p99 = fast[min(len(fast) - 1, int(0.99 * len(fast)))]
    print(f"\n{len(ok)} answered, {len(rejected)} rejected; rejection p50 {fast[len(fast) // 2] * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms; slowest answer {max(s for _, s, _ in ok):.1f} s")
    assert p99 < 1.0
    # Waiting is bounded by the queue timeout plus the batch being computed (a few requests' worth).
    assert max(seconds for _, seconds, _ in ok) < TIMEOUT_S + 10
    assert small_queue.process.poll() is None
    with PoolingClient(small_queue.grpc_url, protocol="grpc") as client:
        assert np.abs(client.embed(texts) - reference).max() <= 1e-5


def test_gateway_turns_overload_into_429_with_retry_after(small_queue) -> None:
    texts = _texts()

    async def flood(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            return await asyncio.gather(*(http.post("/v1/embeddings", json={"model": "minilm", "input": texts})
                                          for _ in range(CLIENTS)))

    with running_gateway(small_queue.grpc_url, admin_key=small_queue.admin_key) as url:
        responses = asyncio.run(flood(url))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429} and 200 in codes and 429 in codes, codes
    for response in responses:
        if response.status_code == 429:  # from a full queue (1 s), or the tokenizer's estimate
            assert int(response.headers["retry-after"]) >= 1
            assert "overloaded" in response.json()["error"]["message"]


def test_a_scorer_and_a_plugin_behind_an_overloaded_ensemble_answer_retryably(small_queue) -> None:
    """Errors keep their code through BLS: with more scorer and plugin instances calling the ensemble than
    its queue of 2 holds, their callers see a retryable UNAVAILABLE (503), never their own bad input (400)."""
    texts = _texts()

    async def flood(call) -> list[int]:
        async with AsyncPoolingClient(small_queue.grpc_url, retries=1) as client:
            await client.info("minilm")

            async def one() -> int:
                try:
                    await call(client)
                    return 200
                except Exception as error:
                    return classify(error).status

            return await asyncio.gather(*(one() for _ in range(CLIENTS)))

    scores = asyncio.run(flood(lambda client: client.score(texts[0], texts, model="minilm")))
    plugin = asyncio.run(flood(lambda client: client.plugin("minilm_zero_shot", texts, labels=["a", "b"])))
    for statuses in (scores, plugin):
        assert set(statuses) <= {200, 503} and 503 in statuses, statuses


def test_a_plugin_that_fails_answers_500_and_the_server_keeps_serving(small_queue) -> None:
    """A plugin's own bug (here zero_shot formatting a template that is not a string) is the server's
    fault: INTERNAL / 500, not the caller's bad input; the next request is answered."""
    from tritonclient.utils import InferenceServerException

    with PoolingClient(small_queue.grpc_url, protocol="grpc") as client:
        with pytest.raises(InferenceServerException) as failure:
            client.plugin("minilm_zero_shot", ["a text"], labels=["a", "b"], template=5)
        assert classify(failure.value).status == 500 and "AttributeError" in str(failure.value)
        assert client.plugin("minilm_zero_shot", ["a text"], labels=["a", "b"])[0]["label"] in ("a", "b")


ADMISSION_TIMEOUT_S, ADMISSION_CLIENTS = 4, 24


@pytest.fixture(scope="module")
def short_timeout(tmp_path_factory: pytest.TempPathFactory):
    """minilm as exported by default (queues of 128) with a queue timeout of ADMISSION_TIMEOUT_S."""
    repository = tmp_path_factory.mktemp("short_timeout")
    for stage in stages("minilm"):
        if (REPOSITORY / stage).is_dir():
            shutil.copytree(REPOSITORY / stage, repository / stage)

    def short(message) -> None:
        if message.backend == "scorer":  # one caller, one waiting: the scorer's own queue overflows
            assert message.HasField("dynamic_batching"), "the export gives the scorer a bounded queue"
            message.instance_group[0].count, message.dynamic_batching.default_queue_policy.max_queue_size = 1, 1
        elif message.HasField("dynamic_batching"):
            message.dynamic_batching.default_queue_policy.default_timeout_microseconds = ADMISSION_TIMEOUT_S * 10**6

    for config in repository.glob("*/config.pbtxt"):
        edit_config(config, short)
    server = start_server(repository, repository / "server.log")
    yield server
    assert server.stop() == 0


def _grpc_flood(url: str, texts: list[str], warm: int) -> list[tuple[str, float, object]]:
    """`warm` requests one at a time, then ADMISSION_CLIENTS raw tritonclient callers at once, each with
    `texts`: ("ok", seconds, embeddings) or ("refused", seconds, error) per caller of the flood."""
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    from pooltriton.contract import TEXT
    from pooltriton.contract.requests import text_array

    async def run() -> list[tuple[str, float, object]]:
        client = grpcclient.InferenceServerClient(url)

        async def one() -> tuple[str, float, object]:
            tensor = grpcclient.InferInput(TEXT, [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(text_array(texts, batched=True))
            started = time.monotonic()
            try:
                result = await client.infer("minilm", [tensor])
                return "ok", time.monotonic() - started, result.as_numpy("EMBEDDING")
            except InferenceServerException as error:
                return "refused", time.monotonic() - started, error

        try:
            for _ in range(warm):
                assert (await one())[0] == "ok"
            return await asyncio.gather(*(one() for _ in range(ADMISSION_CLIENTS)))
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_flood_that_reaches_a_fresh_server_first_loses_nothing_it_admitted(short_timeout, minilm_st) -> None:
    """The flood below, as the server's first traffic: the encoder timed a batch at load, so the tokenizer
    stage admits by that rate instead of admitting everything until batches were measured (the whole
    flood then waited out the queue timeout in part). Every request is answered exactly or refused at once
    by admission; none expires in a queue. (Runs before the module's other user of the server.)"""
    texts = _texts()
    outcomes = _grpc_flood(short_timeout.grpc_url, texts, warm=0)
    ok = [o for o in outcomes if o[0] == "ok"]
    refused = [str(error) for kind, _, error in outcomes if kind == "refused"]
    assert ok and refused, (len(ok), refused)
    assert all("retry after" in message for message in refused), set(refused)  # none "timeout expired"
    reference = minilm_st.encode(texts, normalize_embeddings=True, batch_size=32)
    for _, _, vectors in ok:
        assert np.abs(vectors - reference).max() <= 1e-5
    print(f"\nfresh server: {len(ok)} answered (slowest {max(s for _, s, _ in ok):.1f} s of a "
          f"{ADMISSION_TIMEOUT_S} s deadline), {len(refused)} refused by admission")


def test_direct_grpc_clients_are_refused_at_once_by_the_work_queued_not_by_a_queue_timeout(
        short_timeout, minilm_st) -> None:
    """Admission by work inside Triton (backends.workboard): 24 raw tritonclient callers at once, each
    with 32 long texts (~17 s of encoder time) against a 4 s queue timeout and queues of 128 that never
    fill. The tokenizer stage refuses what its encoder cannot clear in time, at once and retryably,
    instead of letting it wait out the timeout; what it admits is answered, exactly, in time."""
    texts = _texts()
    reference = minilm_st.encode(texts, normalize_embeddings=True, batch_size=32)
    # One at a time first: the encoder's rate measured from real batches.
    outcomes = _grpc_flood(short_timeout.grpc_url, texts, warm=MIN_ANSWERS_HERE)
    ok = [o for o in outcomes if o[0] == "ok"]
    refused = [o for o in outcomes if o[0] == "refused"]
    messages = {str(error) for _, _, error in refused}
    assert ok and refused, (len(ok), messages)
    assert all(classify(error).status == 503 for _, _, error in refused), messages
    by_admission = [error for _, _, error in refused if "retry after" in str(error)]
    assert len(by_admission) >= 0.8 * len(refused), messages
    for _, _, vectors in ok:
        assert np.abs(vectors - reference).max() <= 1e-5
    fast = sorted(seconds for _, seconds, _ in refused)
    print(f"\n{len(ok)} answered (slowest {max(s for _, s, _ in ok):.1f} s), {len(refused)} refused "
          f"({len(by_admission)} by admission; p99 {fast[min(len(fast) - 1, int(0.99 * len(fast)))] * 1000:.0f} ms)")
    assert fast[-1] < ADMISSION_TIMEOUT_S  # refused when they arrived (after tokenizing), none timed out
    assert max(seconds for _, seconds, _ in ok) < ADMISSION_TIMEOUT_S + 5  # the deadline, and a batch


def test_the_scorers_own_queue_is_bounded_and_refuses_at_once(short_timeout) -> None:
    """A scorer calls its ensemble through BLS and batches nothing (max_batch_size 0); without a queue
    policy Triton queued its callers without bound. Here it has one instance and room for one more:
    of ADMISSION_CLIENTS scores at once, the rest are refused retryably by the scorer's full queue."""
    texts = _texts()[:8]

    async def flood() -> list[tuple[str, float]]:
        async with AsyncPoolingClient(short_timeout.grpc_url, retries=0) as client:
            await client.info("minilm")

            async def one() -> tuple[str, float]:
                started = time.monotonic()
                try:
                    await client.score(texts[0], texts, model="minilm")
                    return "ok", time.monotonic() - started
                except Exception as error:
                    assert classify(error).status == 503, error
                    return str(error), time.monotonic() - started

            return await asyncio.gather(*(one() for _ in range(ADMISSION_CLIENTS)))

    outcomes = asyncio.run(flood())
    full = [seconds for outcome, seconds in outcomes if "Exceeds maximum queue size" in outcome]
    assert any(outcome == "ok" for outcome, _ in outcomes) and full, outcomes
    print(f"\nscorer: {len(full)} of {len(outcomes)} refused by its queue (slowest refusal {max(full):.2f} s)")


def test_short_queries_during_a_flood_of_long_batches_are_admitted_and_run_ahead(server, minilm_st) -> None:
    """Mixed traffic on the default server (30 s queue timeout, so admission lets ~18 s of long work queue):
    while 2 x ADMISSION_CLIENTS raw callers keep the queue full of 32-text batches (a refused caller tries again
    after the next answer), single short queries are sent at once, three by raw callers at Triton's default
    priority and three by the pooltriton client. All are admitted (long requests leave SHORT_RESERVE of
    the budget to short ones) and answered exactly; the client's run at PRIORITY_SHORT, ahead of batches
    sent before them (counted from the order of the answers, not from their times)."""
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    from pooltriton.contract import TEXT
    from pooltriton.contract.requests import text_array

    texts, queries = _texts(), [f"query {i}: how fast is the server under load" for i in range(6)]
    reference = minilm_st.encode(queries, normalize_embeddings=True)
    longs: list[tuple[float, float]] = []  # (sent, answered) of each answered batch
    shorts: dict[str, list[tuple[float, float]]] = {"default": [], "client": []}

    async def run() -> None:
        raw = grpcclient.InferenceServerClient(server.grpc_url)
        answered, refused, over = asyncio.Condition(), asyncio.Event(), asyncio.Event()

        def inputs(batch: list[str]) -> list:
            tensor = grpcclient.InferInput(TEXT, [len(batch), 1], "BYTES")
            tensor.set_data_from_numpy(text_array(batch, batched=True))
            return [tensor]

        async def flood() -> None:
            for _ in range(40):  # bounded: at most 40 tries per caller
                if over.is_set():
                    return
                sent = time.monotonic()
                try:
                    await raw.infer("minilm", inputs(texts))
                    longs.append((sent, time.monotonic()))
                    async with answered:
                        answered.notify_all()
                except InferenceServerException as error:
                    assert "retry after" in str(error), error  # refused by admission, never expired
                    refused.set()
                    async with answered:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(answered.wait(), 40)

        async def default(i: int) -> None:
            sent = time.monotonic()
            result = await raw.infer("minilm", inputs([queries[i]]))  # raises if refused
            shorts["default"].append((sent, time.monotonic()))
            assert np.abs(result.as_numpy("EMBEDDING")[0] - reference[i]).max() <= 1e-5

        async def client(pooling: AsyncPoolingClient, i: int) -> None:
            sent = time.monotonic()
            vector = await pooling.embed([queries[i]], model="minilm")
            shorts["client"].append((sent, time.monotonic()))
            assert np.abs(np.asarray(vector)[0] - reference[i]).max() <= 1e-5

        async def queries_() -> None:
            async with AsyncPoolingClient(server.grpc_url, retries=0) as pooling:
                await pooling.info("minilm")
                # The queue holds all the long work admission lets in once one is refused.
                await asyncio.wait_for(refused.wait(), 120)
                try:
                    await asyncio.gather(*(default(i) for i in range(3)), *(client(pooling, i) for i in range(3, 6)))
                finally:
                    over.set()

        try:
            await asyncio.gather(queries_(), *(flood() for _ in range(2 * ADMISSION_CLIENTS)))
        finally:
            await raw.close()

    asyncio.run(asyncio.wait_for(run(), 300))  # bounded: a flood of at most 40 tries per caller

    def overtaken(sent: float, done: float) -> int:  # batches sent before this query, answered after it
        return sum(1 for long_sent, long_done in longs if long_sent < sent and long_done > done)

    counts = {kind: [overtaken(*query) for query in timed] for kind, timed in shorts.items()}
    waits = {kind: [f"{done - sent:.1f}" for sent, done in timed] for kind, timed in shorts.items()}
    print(f"\n{len(longs)} long batches answered; short queries (seconds): {waits}; batches overtaken: {counts}")
    assert len(shorts["default"]) == 3 and len(shorts["client"]) == 3
    # A batch of the encoder takes up to MAX_BATCH_SIZE texts: four of these requests. A query at the default
    # level returns with the batches queued before it; one at PRIORITY_SHORT leaves them behind.
    assert min(counts["client"]) >= 8, counts
