"""Benchmark: the served `minilm` ensemble against an in-process baseline B, in one run.

    python -m pooltriton.client.bench [--texts 2000] [--out bench_results]

B = `tokenizers` + ONNX Runtime on the exported MiniLM graph (pooling and normalisation inside),
batches of 32 texts sorted by length, 2 intra-op threads. The served path is measured through a
real tritonserver (started here unless --grpc-url is given) with tritonclient's asyncio gRPC
client: `concurrency` clients each sending requests of `batch` texts. Prints a table, writes JSON
and a PNG plot (throughput vs concurrency). Bounded: a fixed corpus, a fixed number of passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from pooltriton.client.triton import AsyncPoolingClient
from pooltriton.contract import ACTIVATE, ADMIN_KEY_ENV, QUEUE_SIZE, QUEUE_TIMEOUT_MS, TEXT, admin_headers, stages
from pooltriton.contract.config import parse_config
from pooltriton.core.capabilities import detect
from pooltriton.export.defaults import exported_defaults
from pooltriton.export.sizing import queue_size_for

WORDS = (
    "the a of and to in is was for on that with as by at from it an be this are or have not which "
    "model server embedding vector token batch latency throughput request response python triton "
    "pooling sentence semantic search retrieval ranking query document passage context window "
    "internationalization counterrevolutionary electroencephalography incomprehensibilities "
    "hello, world. (parenthetical) [bracketed] e-mail: x@y.org; 3.14 100% $5 — ok! why? #tag"
).split()
PAUSE_S = 0.1  # between single-text calls
BLOCK = 10  # texts per path in turn in the idle series (in_blocks)
SHORT_WORDS = "the a model server text query fast small test vector search data".split()


# The MiniLM embed exports measured against B, each where this CPU runs it (export.defaults).
MINILM_MODELS = ("minilm", "minilm_bf16", "minilm_int8")


def corpus(count: int = 2000, seed: int = 0) -> list[str]:
    """Deterministic texts of 5-120 words (long words and punctuation included)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) for _ in range(count)]


def short_corpus(count: int = 2000, seed: int = 1) -> list[str]:
    """Texts of about 32 tokens."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(SHORT_WORDS) for _ in range(30)) for _ in range(count)]


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": pick(0.50), "p90_ms": pick(0.90), "p99_ms": pick(0.99)}


# ---- baseline B -----------------------------------------------------------------------------------
class Baseline:
    """B: the model's own encoder file run in this process. model.onnx runs on ONNX Runtime (CPU);
    a TorchScript model.pt (the GPU export) runs on the device its config names, in its precision."""

    def __init__(self, repository: Path, model: str = "minilm", threads: int = 2) -> None:
        from pooltriton.core.tokenization import TextTokenizer

        max_length = json.loads((repository / model / "pooler_config.json").read_text())["max_length"]
        names = stages(model)
        self.tokenizer = TextTokenizer(str(repository / names.tokenizer / "1" / "tokenizer.json"), max_length)
        encoder = repository / names.encoder
        if (encoder / "1" / "model.pt").is_file():
            import torch

            from pooltriton.export.verify import torchscript_runner

            config = parse_config(encoder / "config.pbtxt")
            gpu = any(group.kind == group.KIND_GPU for group in config.instance_group)
            self.device = "cuda" if gpu else "cpu"
            torch.set_num_threads(threads)
            # The export's own runner; its .cpu() waits for the GPU, so timings are complete.
            run = torchscript_runner(encoder / "1" / "model.pt", "", self.device).run
            # Feeds go in the order of the config's inputs.
            self.inputs = [tensor.name for tensor in config.input]
        else:
            import onnxruntime as ort

            self.device = "cpu"
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(str(encoder / "1" / "model.onnx"), options,
                                           providers=["CPUExecutionProvider"])
            self.inputs = [i.name for i in session.get_inputs()]

            def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
                return session.run(None, feeds)[0]
        self.run = run

    def embed(self, texts: list[str]) -> np.ndarray:
        from pooltriton.core.activation import normalize

        batch = self.tokenizer(texts)
        # An embed graph normalises where ACTIVATE is 1, as served.
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                 "token_type_ids": batch.token_type_ids, ACTIVATE: np.ones((len(texts), 1), dtype=np.int64)}
        vectors = self.run({n: feeds[n] for n in self.inputs})
        return vectors if ACTIVATE in self.inputs else normalize(vectors)

    def throughput(self, texts: list[str], batch: int = 32, sort: bool = True) -> dict:
        started = time.perf_counter()
        lengths = self.tokenizer.lengths(texts)
        order = sorted(range(len(texts)), key=lambda i: lengths[i]) if sort else list(range(len(texts)))
        computed = 0
        for start in range(0, len(order), batch):
            chunk = [texts[i] for i in order[start : start + batch]]
            computed += len(chunk) * max(lengths[i] for i in order[start : start + batch])
            self.embed(chunk)
        seconds = time.perf_counter() - started
        real = sum(lengths)
        return {"texts_per_s": len(texts) / seconds, "tokens_per_s": real / seconds, "seconds": seconds,
                "real_tokens": real, "padding_pct": 100 * (computed - real) / computed}



# ---- served path ----------------------------------------------------------------------------------
async def _stats(client, names: tuple[str, ...]) -> dict[str, dict]:
    # Statistics are a restricted API: the admin key comes from the server this run started, or from
    # POOLTRITON_ADMIN_KEY for a server given with --grpc-url.
    stats = await client.get_inference_statistics(headers=admin_headers(os.environ.get(ADMIN_KEY_ENV, ""), "grpc"),
                                                  as_json=True)
    out = {}
    for model in stats.get("model_stats", []):
        if model["name"] in names:
            infer = model.get("inference_stats", {})
            out[model["name"]] = {
                "inferences": int(model.get("inference_count", 0)),
                "executions": int(model.get("execution_count", 0)),
                "compute_ns": sum(int(infer.get(k, {}).get("ns", 0)) for k in
                                  ("compute_input", "compute_infer", "compute_output")),
                "queue_ns": int(infer.get("queue", {}).get("ns", 0)),
            }
    return out


def _metric(metrics_url: str | None, name: str, model: str) -> float:
    if not metrics_url:
        return 0.0
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    match = re.search(rf'^{name}{{model="{model}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def served(grpc_url: str, texts: list[str], concurrency: int, batch: int, model: str = "minilm",
                 metrics_url: str | None = None, real_tokens: int | None = None) -> dict:
    client = AsyncPoolingClient(grpc_url)
    await client.info(model)  # the config read stays out of the timings
    names = stages(model)
    timed = (names.tokenizer, names.encoder, names.pooler)
    before = await _stats(client.server, timed)
    padding_before = _metric(metrics_url, "pooltriton_padding_tokens_total", names.encoder)
    tokens_before = _metric(metrics_url, "pooltriton_tokens_total", names.encoder)
    requests = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    queue: asyncio.Queue = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)
    latencies: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            batch_texts = queue.get_nowait()
            started = time.perf_counter()
            await client.encode(batch_texts, model=model)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    after = await _stats(client.server, timed)
    await client.close()
    padding = _metric(metrics_url, "pooltriton_padding_tokens_total", names.encoder) - padding_before
    tokens = _metric(metrics_url, "pooltriton_tokens_total", names.encoder) - tokens_before
    delta = {name: {k: after[name][k] - before.get(name, {}).get(k, 0) for k in after[name]} for name in after}
    compute = sum(d["compute_ns"] for d in delta.values()) or 1
    encoder = delta.get(names.encoder, {"inferences": 0, "executions": 1})
    real = real_tokens if real_tokens is not None else tokens
    return {
        "model": model, "concurrency": concurrency, "batch": batch, "texts_per_s": len(texts) / seconds,
        "tokens_per_s": real / seconds, "seconds": seconds, **percentiles(latencies),
        "padding_pct": 100 * padding / (padding + tokens) if tokens else None,
        "avg_encoder_batch": encoder["inferences"] / max(encoder["executions"], 1),
        "time_share_pct": {name.removeprefix(f"{model}_"): 100 * d["compute_ns"] / compute
                           for name, d in delta.items()},
    }


def in_blocks(texts: list[str], paths: list[str], block: int = BLOCK):
    """(path, text) in the order the idle series run them: blocks of `block` texts, each path in turn
    through the whole block. Within a block a path's calls follow its own, as on an idle server; the
    blocks alternate so that a slow moment of a shared machine hits every path alike. Text by text
    (every path in turn for each text), B followed three other models' runs and came out 10.8-13 ms
    against 8.2-9.1 ms in blocks, which flattered the served paths by ~3 ms."""
    for start in range(0, len(texts), block):
        for path in paths:
            for text in texts[start : start + block]:
                yield path, text


async def single_text_latency(grpc_url: str, texts: list[str], baseline: Baseline,
                              models: tuple[str, ...]) -> dict[str, dict]:
    """One text at a time, B and every served model, in blocks (`in_blocks`). A pause before each
    call lets the previous call's threads go idle: ONNX Runtime's and OpenVINO's pools spin after a
    run, and with 20 ms instead of 100 ms one model measured +10 ms only because another ran before it."""
    client = AsyncPoolingClient(grpc_url)
    for model in models:
        await client.info(model)  # the config read stays out of the timings
    times: dict[str, list[float]] = {"B": [], **{model: [] for model in models}}
    for path, text in in_blocks(texts, list(times)):
        await asyncio.sleep(PAUSE_S)
        started = time.perf_counter()
        if path == "B":
            baseline.embed([text])
        else:
            await client.encode([text], model=path)
        times[path].append(time.perf_counter() - started)
    await client.close()
    return {name: percentiles(values) for name, values in times.items()}


async def through_gateway(base_url: str, texts: list[str], concurrency: int, model: str,
                          real_tokens: int | None = None) -> dict:
    """`concurrency` HTTP clients, each posting one text at a time to the gateway's /v1/embeddings.
    aiohttp drives the load: httpx's async client capped at ~220 requests/s here, under the gateway."""
    import aiohttp

    queue: asyncio.Queue = asyncio.Queue()
    for text in texts:
        queue.put_nowait(text)
    latencies: list[float] = []
    url = f"{base_url}/v1/embeddings"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        async with http.post(url, json={"model": model, "input": texts[:8]}) as answer:
            answer.raise_for_status()

        async def worker() -> None:
            while not queue.empty():
                text = queue.get_nowait()
                started = time.perf_counter()
                async with http.post(url, json={"model": model, "input": [text]}) as answer:
                    answer.raise_for_status()
                    await answer.read()
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"model": model, "concurrency": concurrency, "batch": 1, "texts_per_s": len(texts) / seconds,
            "tokens_per_s": (real_tokens or 0) / seconds, "seconds": seconds, **percentiles(latencies)}


# What an idle HTTP exchange with the gateway costs when it does no work: a route that does not exist.
NO_WORK = "http exchange (404)"


async def gateway_latency(base_url: str, texts: list[str], models: tuple[str, ...]) -> dict[str, dict]:
    """One text at a time through the gateway, in blocks and paused like single_text_latency; and as
    often an exchange that reaches no route (NO_WORK): the HTTP part of the gateway's overhead."""
    import aiohttp

    times: dict[str, list[float]] = {model: [] for model in (*models, NO_WORK)}
    async with aiohttp.ClientSession() as http:
        for path, text in in_blocks(texts, list(times)):
            await asyncio.sleep(PAUSE_S)
            started = time.perf_counter()
            if path == NO_WORK:
                async with http.get(f"{base_url}/no-such-route") as answer:
                    await answer.read()
            else:
                async with http.post(f"{base_url}/v1/embeddings", json={"model": path, "input": [text]}) as answer:
                    answer.raise_for_status()
                    await answer.read()
            times[path].append(time.perf_counter() - started)
    return {model: percentiles(values) for model, values in times.items()}


async def overload(base_url: str, texts: list[str], model: str, clients: int, per_client: int,
                   deadline_s: float, batch: int = 32, warm_up: int = 16) -> dict:
    """An overload through a gateway with admission by work: `clients` HTTP clients each post
    `per_client` requests of `batch` long texts at once. Every request must be answered or refused;
    refusals should come at once (429), answers within the deadline. First `warm_up` requests four at a
    time: the rate admission estimates with (measured only with two requests or more in flight; nothing
    is refused before 8 answers)."""
    import aiohttp

    url = f"{base_url}/v1/embeddings"
    requests = _flood_requests(texts, clients * per_client, batch)
    outcomes: list[tuple[int, float]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def warm(body: list[str]) -> None:
            async with http.post(url, json={"model": model, "input": body}) as answer:
                answer.raise_for_status()

        for first in range(0, warm_up, 4):
            await asyncio.gather(*(warm(body) for body in requests[first:min(first + 4, warm_up)]))

        async def client(index: int) -> None:
            for body in requests[index::clients]:
                started = time.perf_counter()
                async with http.post(url, json={"model": model, "input": body}) as answer:
                    await answer.read()
                    outcomes.append((answer.status, time.perf_counter() - started))

        started = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        seconds = time.perf_counter() - started
    return {**_overload_figures([(("answered" if status == 200 else "refused" if status == 429 else "other"), t)
                                 for status, t in outcomes]),
            "model": model, "clients": clients, "batch": batch, "deadline_s": deadline_s, "seconds": seconds}


def _flood_requests(texts: list[str], count: int, batch: int) -> list[list[str]]:
    """`count` requests of `batch` consecutive texts, wrapping around the corpus."""
    return [texts[(i * batch) % len(texts):][:batch] or texts[:batch] for i in range(count)]


def _refusal_kind(message: str) -> str:
    """A Triton error as the overload counts it: refused by admission (it says when to retry), expired
    (admitted work lost to a queue timeout), or other."""
    from pooltriton.contract.admission import retry_after_in

    if retry_after_in(message) is not None:
        return "refused"
    return "expired" if "timeout expired" in message.lower() else "other"


def _overload_figures(outcomes: list[tuple[str, float]]) -> dict:
    """Counts and times of (answered / refused / other, seconds) outcomes."""
    answered = [t for kind, t in outcomes if kind == "answered"]
    refused = [t for kind, t in outcomes if kind == "refused"]
    expired = sum(kind == "expired" for kind, _ in outcomes)  # admitted, then dropped by a queue timeout
    return {"requests": len(outcomes), "answered": len(answered), "refused": len(refused), "expired": expired,
            "other": len(outcomes) - len(answered) - len(refused) - expired,
            "refusal_p99_ms": 1000 * float(np.percentile(refused, 99)) if refused else None,
            "answer_p99_s": float(np.percentile(answered, 99)) if answered else None,
            "answer_max_s": max(answered, default=None)}


async def overload_grpc(grpc_url: str, texts: list[str], model: str, clients: int, per_client: int,
                        batch: int = 32, warm_up: int = 12, queries: list[str] | None = None) -> dict:
    """The same overload from raw tritonclient gRPC callers (no gateway, no pooltriton client): what the
    tokenizer stage's admission by work does for them (backends.workboard). Refused: UNAVAILABLE that
    says when to retry (admission); expired: Triton's queue timeout (admitted work lost); other: the rest.
    With `queries`, single short texts are sent one after another through the pooltriton client while
    the flood lasts (mixed traffic: `short_queries`)."""
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    from pooltriton.contract.requests import text_array

    requests = _flood_requests(texts, clients * per_client, batch)
    client = grpcclient.InferenceServerClient(grpc_url)
    outcomes: list[tuple[str, float]] = []

    async def one(body: list[str]) -> str:
        tensor = grpcclient.InferInput(TEXT, [len(body), 1], "BYTES")
        tensor.set_data_from_numpy(text_array(body, batched=True))
        try:
            await client.infer(model, [tensor])
            return "answered"
        except InferenceServerException as error:
            return _refusal_kind(str(error))

    try:
        for body in requests[:warm_up]:
            assert await one(body) == "answered"

        async def caller(index: int) -> None:
            for body in requests[index::clients]:
                started = time.perf_counter()
                outcomes.append((await one(body), time.perf_counter() - started))

        flooding = asyncio.Event()
        side = asyncio.create_task(_short_queries(grpc_url, model, queries or [], flooding))
        started = time.perf_counter()
        try:
            await asyncio.gather(*(caller(i) for i in range(clients)))
        except BaseException:
            side.cancel()
            raise
        finally:
            flooding.set()
        seconds = time.perf_counter() - started
        shorts = await side
    finally:
        await client.close()
    return {**_overload_figures(outcomes), "model": model, "clients": clients, "batch": batch, "seconds": seconds,
            **({"short_queries": _overload_figures(shorts)} if shorts else {})}


async def _short_queries(grpc_url: str, model: str, queries: list[str], over: asyncio.Event) -> list[tuple[str, float]]:
    """One short text at a time through the pooltriton client (short requests at PRIORITY_SHORT) until
    `over` is set: (answered / refused / expired / other, seconds) each."""
    from pooltriton.client import AsyncPoolingClient

    outcomes: list[tuple[str, float]] = []
    if not queries:
        return outcomes
    async with AsyncPoolingClient(grpc_url, retries=0) as pooling:
        await pooling.info(model)
        for index in range(10**6):
            if over.is_set():
                break
            started = time.perf_counter()
            try:
                await pooling.embed([queries[index % len(queries)]], model=model)
                outcomes.append(("answered", time.perf_counter() - started))
            except Exception as error:
                outcomes.append((_refusal_kind(str(error)), time.perf_counter() - started))
    return outcomes


async def overload_kserve_http(http_url: str, texts: list[str], model: str, clients: int, per_client: int,
                               tokens_of, batch: int = 32) -> dict:
    """The same overload over KServe v2 HTTP (`/v2/models/<model>/infer`), as the fresh server's first
    traffic: no warm-up, so admission has only the rate each encoder timed at load. Goodput: the tokens
    of the answered requests (`tokens_of(body)`, counted before the flood) per second of the flood."""
    import aiohttp

    requests = _flood_requests(texts, clients * per_client, batch)
    tokens = [tokens_of(body) for body in requests]
    url = f"http://{http_url}/v2/models/{model}/infer"
    outcomes: list[tuple[str, float]] = []
    answered_tokens = 0

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def one(body: list[str]) -> str:
            payload = {"inputs": [{"name": TEXT, "shape": [len(body), 1], "datatype": "BYTES", "data": body}]}
            try:
                async with http.post(url, json=payload) as answer:
                    text = await answer.text()  # Triton's errors: {"error": ...} as text/plain
            except aiohttp.ClientError:
                return "other"
            if answer.status == 200:
                return "answered"
            try:
                return _refusal_kind(str(json.loads(text).get("error", text)))
            except (ValueError, AttributeError):
                return "other"

        async def caller(index: int) -> None:
            nonlocal answered_tokens
            for number in range(index, len(requests), clients):
                started = time.perf_counter()
                kind = await one(requests[number])
                outcomes.append((kind, time.perf_counter() - started))
                answered_tokens += tokens[number] if kind == "answered" else 0

        started = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(clients)))
        seconds = time.perf_counter() - started
    return {**_overload_figures(outcomes), "model": model, "clients": clients, "batch": batch, "seconds": seconds,
            "answered_tokens_per_s": answered_tokens / seconds}


def start_gateway(grpc_url: str, port: int, log: Path, *options: str):
    """The gateway as deployed: its own process (`python -m pooltriton.gateway`), ready when /health is."""
    import subprocess

    import httpx

    process = subprocess.Popen([sys.executable, "-m", "pooltriton.gateway", "--triton", grpc_url, "--port", str(port),
                                *options], stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the gateway did not become healthy; see {log}")


# ---- the run --------------------------------------------------------------------------------------
def run(repository: Path, out: Path, count: int, concurrencies: list[int], grpc_url: str | None,
        metrics_url: str | None, latency_texts: int = 50, models: tuple[str, ...] = ("minilm",),
        overload_clients: int = 64, overload_per_client: int = 3, deadline_s: float = QUEUE_TIMEOUT_MS / 1000) -> dict:
    from socket import socket

    from pooltriton.server.assemble import assemble
    from pooltriton.server.launcher import TritonServer

    def port() -> int:
        with socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    server = gateway = None
    if grpc_url is None:
        backends = assemble(Path(__file__).resolve().parent.parent / "build" / "backends")
        server = TritonServer(repository, backends, port(), port(), port(), log_file=out / "server.log").start()
        server.wait_ready()
        os.environ[ADMIN_KEY_ENV] = server.admin_key
        grpc_url, metrics_url = server.grpc_url, f"http://localhost:{server.metrics_port}/metrics"
    gateway_port = port()
    gateway = start_gateway(grpc_url, gateway_port, out / "gateway.log")
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    try:
        texts, shorts = corpus(count), short_corpus(count)
        baseline = Baseline(repository)
        baseline.embed(texts[:8])  # warm-up
        real_tokens = sum(baseline.tokenizer.lengths(texts))
        short_tokens = sum(baseline.tokenizer.lengths(shorts))
        results: dict = {"corpus": {"texts": count, "real_tokens": real_tokens, "short_real_tokens": short_tokens},
                         "models": list(models), "served": [], "served_short": [], "served_latency": [],
                         "gateway_short": []}
        long_texts = sorted(texts, key=len)[len(texts) // 2:]  # the longer half: requests of real work
        if server is not None:  # first, while the server is fresh: the cold board
            results["overload_kserve_http"] = asyncio.run(overload_kserve_http(
                server.http_url, long_texts, models[0], overload_clients, overload_per_client,
                lambda body: sum(baseline.tokenizer.lengths(body))))
        results["baseline_sorted"] = baseline.throughput(texts, sort=True)
        results["baseline_corpus_order"] = baseline.throughput(texts, sort=False)
        results["baseline_short"] = baseline.throughput(shorts, sort=True)
        for model in models:
            asyncio.run(served(grpc_url, texts[:64], 2, 32, model, metrics_url))  # warm-up
            results["served"] += [asyncio.run(served(grpc_url, texts, c, 32, model, metrics_url, real_tokens))
                                  for c in concurrencies]
            results["served_short"].append(asyncio.run(served(grpc_url, shorts, 64, 1, model, metrics_url,
                                                              short_tokens)))
            # Warm-up, as for gRPC above: the first run through a fresh gateway paid for its first calls
            # (fp32 0.77-0.86 x gRPC in two runs, 0.96-1.02 when warmed).
            asyncio.run(through_gateway(gateway_url, shorts[:200], 64, model))
            results["gateway_short"].append(asyncio.run(through_gateway(gateway_url, shorts, 64, model,
                                                                        short_tokens)))
        # B again at the end: the ratios use the mean of both, so drift over the run cancels out.
        before, after = results["baseline_sorted"], baseline.throughput(texts, sort=True)
        results["baseline_sorted_runs"] = [before["tokens_per_s"], after["tokens_per_s"]]
        results["baseline_sorted"] = {**before, **{k: (before[k] + after[k]) / 2 for k in
                                                   ("texts_per_s", "tokens_per_s", "seconds")}}
        # One idle text per path: short texts (where fixed costs show), then long ones.
        for key, sample in (("", shorts[:latency_texts]), ("long_", texts[:latency_texts])):
            latency = asyncio.run(single_text_latency(grpc_url, sample, baseline, models))
            results[f"{key}baseline_latency"] = latency.pop("B")
            results[f"{key}served_latency"] = [{"model": model, **values} for model, values in latency.items()]
            through = asyncio.run(gateway_latency(gateway_url, sample, models))
            results[f"{key}gateway_latency"] = [{"model": model, **values} for model, values in through.items()]
        # Overload last (it leaves queues full for a while): from raw gRPC callers (the deadline is Triton's
        # queue timeout), then through a gateway of its own with the deadline.
        results["overload_grpc"] = asyncio.run(overload_grpc(grpc_url, long_texts, models[0], overload_clients,
                                                             overload_per_client, queries=shorts[:200]))
        gateway.terminate()
        gateway.wait(30)
        gateway_port = port()
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        gateway = start_gateway(grpc_url, gateway_port, out / "gateway.log", "--deadline-s", str(deadline_s))
        results["overload"] = asyncio.run(overload(gateway_url, long_texts, models[0], overload_clients,
                                                   overload_per_client, deadline_s))
        if server is not None:
            results["peak_rss_mb"] = server.memory_mb("VmHWM")
    finally:
        gateway.terminate()
        gateway.wait(30)
        if server is not None:
            server.stop()
    return results


def table(results: dict) -> str:
    base = results["baseline_sorted"]["tokens_per_s"]
    short_base = results["baseline_short"]["tokens_per_s"]
    rows = [("path", "texts/s", "tokens/s", "x B", "p50 ms", "p90 ms", "p99 ms", "pad %", "avg batch",
             "compute share % by stage")]
    rows.append(("B in-process, sorted, batch 32 (*)", *_cells(results["baseline_sorted"], base)))
    rows.append(("B in-process, corpus order", *_cells(results["baseline_corpus_order"], base)))
    for item in results["served"]:
        rows.append((f"Triton {item['model']}, {item['concurrency']} clients x 32", *_cells(item, base)))
    rows.append(("B short texts (~32 tok), sorted", *_cells(results["baseline_short"], short_base)))
    for item in results["served_short"]:
        rows.append((f"Triton {item['model']} short, 64 clients x 1", *_cells(item, short_base)))
    for item in results.get("gateway_short", []):
        rows.append((f"gateway {item['model']} short, 64 clients x 1", *_cells(item, short_base)))
    for kind, key in (("short", ""), ("long", "long_")):
        if f"{key}baseline_latency" not in results:
            continue
        for label, lat in [("B", results[f"{key}baseline_latency"])] + [
                (f"Triton {item['model']}", item) for item in results[f"{key}served_latency"]] + [
                (f"gateway {item['model']}", item) for item in results.get(f"{key}gateway_latency", [])]:
            rows.append((f"single {kind} text: {label}", "", "", "", f"{lat['p50_ms']:.1f}", f"{lat['p90_ms']:.1f}",
                         f"{lat['p99_ms']:.1f}", "", "", ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    runs = results.get("baseline_sorted_runs")
    if runs:
        lines.append(f"(*) mean of B before and after the served runs: {runs[0]:.0f} and {runs[1]:.0f} tokens/s")
    auto = results.get("machine", {}).get("capabilities", {}).get("auto_precision", {}).get("openvino")
    if auto:
        lines.append(f"--precision auto (openvino) on this CPU: {auto}; {_auto_ratio(results, auto)}")
    lines += queue_sizing(results) + gateway_ratios(results) + overload_lines(results)
    if "peak_rss_mb" in results:
        lines.append(f"peak RSS of tritonserver and its stubs: {results['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


def gateway_ratios(results: dict) -> list[str]:
    """The HTTP path against the gRPC one, measured in this run (targets: >= 0.9 x, p50 within +1 ms)."""
    lines = []
    grpc = {item["model"]: item for item in results["served_short"]}
    grpc_latency = {item["model"]: item for item in results["served_latency"]}
    for item in results.get("gateway_short", []):
        model = item["model"]
        lines.append(f"gateway / gRPC ({model}, 64 clients x 1 short text): "
                     f"{item['texts_per_s'] / grpc[model]['texts_per_s']:.2f} x throughput")
    for item in results.get("gateway_latency", []):
        model = item["model"]
        if model == NO_WORK:
            lines.append(f"gateway: one idle {NO_WORK}, no work done: p50 {item['p50_ms']:.1f} ms (the HTTP hop's "
                         "share of gateway - gRPC)")
            continue
        over_grpc = item["p50_ms"] - grpc_latency[model]["p50_ms"]
        over_b = grpc_latency[model]["p50_ms"] - results["baseline_latency"]["p50_ms"]
        lines.append(f"gateway - gRPC ({model}, one idle short text): p50 {over_grpc:+.1f} ms; "
                     f"gRPC - B p50 {over_b:+.1f} ms")
    return lines


def overload_lines(results: dict) -> list[str]:
    lines = []
    capacity = max((item["tokens_per_s"] for item in results.get("served", [])
                    if item["model"] == results["models"][0]), default=None)
    for key, path in (("overload_kserve_http", "KServe HTTP, a fresh server's first traffic"),
                      ("overload_grpc", "raw gRPC callers, Triton's queue timeout"),
                      ("overload", "through the gateway")):
        item = results.get(key)
        if not item:
            continue
        refusal = f"{item['refusal_p99_ms']:.0f} ms" if item["refusal_p99_ms"] is not None else "-"
        answer = (f"p99 {item['answer_p99_s']:.1f} s, max {item['answer_max_s']:.1f} s"
                  if item["answer_p99_s"] is not None else "-")
        deadline = f"deadline {item['deadline_s']:g} s, " if "deadline_s" in item else ""
        lines.append(f"overload ({item['model']}, {item['clients']} clients, {item['requests']} requests of "
                     f"{item['batch']} long texts, {deadline}{path}): {item['answered']} answered ({answer}), "
                     f"{item['refused']} refused at once (p99 {refusal}), {item.get('expired', 0)} expired, "
                     f"{item['other']} other errors")
        if item.get("short_queries"):
            short = item["short_queries"]
            lines.append(f"  short queries during the flood (one at a time, pooltriton client): {short['answered']} "
                         f"answered (p99 {short['answer_p99_s']:.2f} s, max {short['answer_max_s']:.2f} s), "
                         f"{short['refused']} refused, {short['expired']} expired"
                         if short["answer_p99_s"] is not None else
                         f"  short queries during the flood: none answered, {short['refused']} refused")
        if "answered_tokens_per_s" in item and capacity:
            lines.append(f"  goodput: {item['answered_tokens_per_s']:.0f} answered tokens/s over the flood's "
                         f"{item['seconds']:.1f} s = {item['answered_tokens_per_s'] / capacity:.2f} x the best served "
                         f"rate of this run ({capacity:.0f} tokens/s)")
    return lines


def queue_sizing(results: dict) -> list[str]:
    """`--queue-size` from the measured capacity: the most requests a stage clears within the timeout."""
    lines = []
    for label, items in (("32-text", results["served"]), ("1-text", results["served_short"])):
        for item in items[-1:]:  # the highest concurrency: the saturated throughput
            per_s = item["texts_per_s"] / item["batch"]
            size = queue_size_for(per_s, QUEUE_TIMEOUT_MS)
            lines.append(f"queue sizing ({item['model']}, {label} requests): {per_s:.1f} requests/s x "
                         f"{QUEUE_TIMEOUT_MS / 1000:g} s timeout -> at most --queue-size {size} "
                         f"(default {QUEUE_SIZE})")
    return lines


def _auto_ratio(results: dict, auto: str) -> str:
    """The auto-chosen precision's best served throughput over fp32's (minilm), measured in this run."""
    best = {model: max((r["tokens_per_s"] for r in results["served"] if r["model"] == model), default=0.0)
            for model in results["models"]}
    model = "minilm" if auto == "fp32" else f"minilm_{auto}"
    if auto == "fp32":
        return "the fp32 model is what auto serves (ratio to fp32 1.00)"
    if best.get(model) and best.get("minilm"):
        return f"{model} runs at {best[model] / best['minilm']:.2f} x fp32 (best of each)"
    if auto == "int8":
        return ("int8 is served only where the quantized model meets its bounds; MiniLM does not "
                "(docs/performance.md), so auto falls back to bf16/fp32 for it")
    return f"{model} was not measured"


def _cells(item: dict, base: float) -> tuple:
    share = item.get("time_share_pct")
    # The stages the ensemble has (an embed ensemble ends at its encoder).
    share_text = " ".join(f"{k[:3]} {v:.0f}" for k, v in share.items()) if share else ""
    return (f"{item['texts_per_s']:.0f}", f"{item['tokens_per_s']:.0f}", f"{item['tokens_per_s'] / base:.2f}",
            f"{item['p50_ms']:.1f}" if "p50_ms" in item else "", f"{item['p90_ms']:.1f}" if "p90_ms" in item else "",
            f"{item['p99_ms']:.1f}" if "p99_ms" in item else "",
            f"{item['padding_pct']:.1f}" if item.get("padding_pct") is not None else "",
            f"{item['avg_encoder_batch']:.1f}" if "avg_encoder_batch" in item else "", share_text)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4))
    for model in results["models"]:
        rows = [r for r in results["served"] if r["model"] == model]
        axis.plot([r["concurrency"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o",
                  label=f"Triton {model} (gRPC, 32 texts/request)")
    axis.axhline(results["baseline_sorted"]["tokens_per_s"], color="gray", linestyle="--",
                 label="B in-process (sorted)")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("real tokens / s")
    axis.set_title("all-MiniLM-L6-v2")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pooltriton-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", default="model_repository")
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--texts", type=int, default=2000, help="corpus size")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated client counts")
    parser.add_argument("--grpc-url", help="use a running server instead of starting one")
    parser.add_argument("--metrics-url", help="its metrics endpoint (for padding %%)")
    parser.add_argument("--latency-texts", type=int, default=100,
                        help="idle single texts per path, short and long each")
    parser.add_argument("--overload-clients", type=int, default=64)
    parser.add_argument("--overload-requests", type=int, default=3, help="requests per overload client")
    parser.add_argument("--deadline-s", type=float, default=QUEUE_TIMEOUT_MS / 1000,
                        help="the overload gateway's admission deadline (default: Triton's queue timeout)")
    parser.add_argument("--models", help="comma-separated served ensembles (MiniLM exports), each measured "
                        "against B (default: minilm, and minilm_bf16 / minilm_int8 where this CPU runs them)")
    args = parser.parse_args(argv)
    capabilities = detect()
    models = args.models or ",".join(m for m in MINILM_MODELS if m in exported_defaults(capabilities))
    print(capabilities.report(), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run(Path(args.repository), out, args.texts, [int(c) for c in args.concurrency.split(",")],
                  args.grpc_url, args.metrics_url, args.latency_texts, tuple(models.split(",")),
                  args.overload_clients, args.overload_requests, args.deadline_s)
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                          "capabilities": capabilities.summary()}
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "throughput.png")
    print(table(results))
    print(f"wrote {out / 'bench.json'} and {out / 'throughput.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
