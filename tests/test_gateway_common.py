"""What every dialect shares, against a fake Triton client (no server): model names and lists, the API key,
CORS, metrics, body limits, cancellation on disconnect, errors by status."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from pooltriton.gateway import create_app


def test_models_list_reads_only_what_triton_says(http) -> None:
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert set(models) == {"emb", "cls"} and models["emb"]["max_model_len"] == 16 and models["emb"]["scoring"]


def test_cors_answers_a_browsers_preflight_before_the_api_key_and_can_be_narrowed(fake) -> None:
    """Any origin by default, as vLLM and text-embeddings-inference; the preflight (which carries no key) is
    answered, the request itself still needs the key; a narrowed list leaves other origins without the header."""
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    with TestClient(create_app("unused:0", api_key="s3cret", client=fake)) as client:
        answer = client.options("/v1/embeddings", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
        refused = client.post("/v1/embeddings", json={"model": "emb", "input": "x"},
                              headers={"origin": "https://app.example"})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"
    with TestClient(create_app("unused:0", client=fake, allowed_origins=["https://app.example"])) as client:
        assert client.options("/v1/embeddings", headers=preflight).status_code == 200
        other = client.post("/v1/embeddings", json={"model": "emb", "input": "x"}, headers={"origin": "https://x.io"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        plain = client.post("/v1/embeddings", json={"model": "emb", "input": "x"})  # no browser: untouched
        assert plain.status_code == 200 and "vary" not in plain.headers
    with TestClient(create_app("unused:0", client=fake, allowed_origins=[])) as client:
        plain = client.post("/v1/embeddings", json={"model": "emb", "input": "x"}, headers={"origin": "https://x.io"})
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_api_key(fake) -> None:
    with TestClient(create_app("unused:0", api_key="s3cret", client=fake)) as client:
        assert client.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 401
        wrong = client.post("/v1/embeddings", json={"model": "emb", "input": "x"},
                            headers={"authorization": "Bearer s3cres"})
        assert wrong.status_code == 401
        right = client.post("/v1/embeddings", json={"model": "emb", "input": "x"},
                            headers={"authorization": "Bearer s3cret"})
        assert right.status_code == 200 and client.get("/health").status_code == 200
        assert client.get("/ping").status_code == 200 and client.get("/version").status_code == 401
        # text-embeddings-inference's GET / is a health check; its POST / an inference, behind the key
        assert client.get("/").status_code == 200 and client.post("/", json={"inputs": "x"}).status_code == 401


def test_unavailable_from_a_server_that_is_not_ready_is_503(http, fake) -> None:
    fake.server.ready = False
    response = http.post("/v1/embeddings", json={"model": "emb", "input": "busy"})
    assert response.status_code == 503 and "retry-after" not in response.headers


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """The exposition parsed by prometheus_client's own parser (it raises on an invalid one)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_by_route_template_with_bounded_series(http) -> None:
    """10,000 distinct unknown paths (a scanner) add no series; a path with a quote and a newline still
    leaves a valid exposition; known routes are counted by their template, status by status."""
    import asyncio

    async def scan(count: int) -> set[int]:  # straight through ASGI: 10,000 requests in seconds
        statuses = set()
        for i in range(count):
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                     "scheme": "http", "path": f"/scan/{i}", "raw_path": f"/scan/{i}".encode(),
                     "query_string": b"", "headers": [], "client": ("127.0.0.1", 1), "server": ("test", 80)}
            sent, asked = [], []

            async def receive(asked=asked) -> dict:
                if not asked:  # the body; after it, like a server whose client stays connected: wait
                    asked.append(True)
                    return {"type": "http.request", "body": b"", "more_body": False}
                await asyncio.Event().wait()
                return {"type": "http.disconnect"}

            async def send(message: dict, sent=sent) -> None:
                sent.append(message)

            await http.app(scope, receive, send)
            statuses.add(sent[0]["status"])
        return statuses

    assert asyncio.run(scan(10_000)) == {404}
    assert http.get("/x%22y%0Az").status_code == 404  # the path holds a quote and a newline
    assert http.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 200
    assert http.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404
    samples = _samples(http.get("/metrics").text)
    requests = "pooltriton_gateway_requests_total"
    assert samples[(requests, (("route", "unmatched"), ("status", "404")))] == 10_001
    assert samples[(requests, (("route", "/v1/embeddings"), ("status", "200")))] == 1
    assert samples[(requests, (("route", "/v1/embeddings"), ("status", "404")))] == 1
    duration = "pooltriton_gateway_request_duration_seconds_count"
    assert samples[(duration, (("route", "unmatched"),))] == 10_001
    assert len(samples) < 100


def test_bodies_over_the_limit_get_413_over_real_http(fake) -> None:
    """Through uvicorn (real HTTP, fake Triton): a 20 MB body gets its 413 (it used to be a reset
    connection), so does a chunked body that states no length, both are counted, and the next request
    is served."""
    import httpx

    from conftest import running_gateway

    with running_gateway("unused:0", client=fake) as base, httpx.Client(base_url=base, timeout=60) as http:
        json_type = {"content-type": "application/json"}
        huge = http.post("/v1/embeddings", content=b"x" * (20 << 20), headers=json_type)
        assert huge.status_code == 413 and "request body over" in huge.json()["error"]["message"]
        chunked = http.post("/v1/embeddings", content=(b"x" * (1 << 20) for _ in range(12)), headers=json_type)
        assert chunked.status_code == 413 and "content-length" not in chunked.request.headers
        assert http.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 200
        samples = _samples(http.get("/metrics").text)
    assert samples[("pooltriton_gateway_requests_total", (("route", "/v1/embeddings"), ("status", "413")))] == 2


def test_cancel_on_disconnect_cancels_only_for_a_client_gone() -> None:
    """The middleware alone, over an app that waits until released: a client that disconnects before the
    answer cancels the handler (counted, nothing raised, no cancellation left on the request's task); a
    cancellation from outside (the server stopping) goes through uncounted, also when the client left at
    the same moment; an answered request is left alone."""
    import asyncio

    from pooltriton.gateway.disconnect import CancelOnDisconnect

    async def case(disconnect: bool, outside: bool) -> tuple[list[float], str, int]:
        release, started, client_gone = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def app(scope, receive, send) -> None:
            await receive()  # the body
            started.set()
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        cancelled: list[float] = []
        middleware = CancelOnDisconnect(app, on_cancel=lambda scope, seconds: cancelled.append(seconds))
        bodies = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict:
            if bodies:
                return bodies.pop()
            await client_gone.wait()
            return {"type": "http.disconnect"}

        async def send(_message: dict) -> None:
            pass

        async def request() -> int:
            await middleware({"type": "http"}, receive, send)
            return asyncio.current_task().cancelling()

        task = asyncio.ensure_future(request())
        await started.wait()
        if disconnect:
            client_gone.set()
        if outside:
            task.cancel()
        if not disconnect and not outside:
            release.set()
        try:
            left = await task
            return cancelled, "returned", left
        except asyncio.CancelledError:
            return cancelled, "raised", -1

    cancelled, how, left = asyncio.run(case(disconnect=True, outside=False))
    assert len(cancelled) == 1 and how == "returned" and left == 0
    cancelled, how, _ = asyncio.run(case(disconnect=False, outside=True))
    assert cancelled == [] and how == "raised"
    cancelled, how, _ = asyncio.run(case(disconnect=True, outside=True))
    assert cancelled == [] and how == "raised"
    cancelled, how, left = asyncio.run(case(disconnect=False, outside=False))
    assert cancelled == [] and how == "returned" and left == 0


def test_ping_and_version(http, fake) -> None:
    assert http.get("/ping").json() == {"status": "ok"} and http.post("/ping").status_code == 200
    fake.server.ready = False
    assert http.get("/ping").status_code == 503
    assert http.get("/version").json()["version"] == "0.1.0"


def test_served_model_names_reach_their_model_and_a_shared_one_is_told_apart_by_task(fake) -> None:
    """--served-model-name: a model answers to its other names too (an OpenAI model name, for one); models
    exported under one shared name (BGE-M3's dense, lexical and ColBERT exports, as vLLM serves one model)
    are told apart by the task the request asks for, the model's own name first where none is asked."""
    fake.server.configs["emb"]["parameters"]["served_names"] = {"string_value": json.dumps(
        ["text-embedding-3-small", "shared"])}
    fake.server.configs["cls"]["parameters"]["served_names"] = {"string_value": json.dumps(["shared", "emb"])}
    with TestClient(create_app("unused:0", client=fake)) as http:
        aliased = http.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"})
        assert aliased.status_code == 200 and fake.requests[-1].model == "emb"
        assert aliased.json()["model"] == "text-embedding-3-small"  # the name asked for, as vLLM answers
        assert http.post("/v1/embeddings", json={"model": "shared", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb"
        assert http.post("/classify", json={"model": "shared", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "cls"
        pooled = http.post("/pooling", json={"model": "shared", "input": "x", "task": "classify"})
        assert pooled.status_code == 200 and fake.requests[-1].model == "cls"
        # "emb" is the embedding model's own name: a classify request for it reaches the classifier that
        # answers to it as well; with no task asked, the model of that name.
        assert http.post("/classify", json={"model": "emb", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "cls"
        assert http.post("/pooling", json={"model": "emb", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb"
        wrong = http.post("/pooling", json={"model": "text-embedding-3-small", "input": "x", "task": "classify"})
        assert wrong.status_code == 400, wrong.text
        assert http.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert set(models) == {"emb", "cls", "text-embedding-3-small", "shared"}
        assert models["text-embedding-3-small"]["root"] == "emb" and models["shared"]["root"] == "cls"  # by name
        assert http.get("/info", params={"model": "text-embedding-3-small"}).json()["served_model_name"] == \
            "text-embedding-3-small"
        # Every route picks by what it needs: TEI's /embed an embedding model, /rerank and /score one that
        # can score, /invocations the task its body names, the tokenizer routes the name's model.
        assert http.post("/embed", json={"model": "shared", "inputs": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb"
        reranked = http.post("/rerank", json={"model": "shared", "query": "q", "documents": ["d"]})
        assert reranked.status_code == 200 and fake.requests[-1].model == "emb_score"
        scored = http.post("/score", json={"model": "shared", "text_1": "q", "text_2": "d"})
        assert scored.status_code == 200 and fake.requests[-1].model == "emb_score"
        assert reranked.json()["model"] == scored.json()["model"] == "shared"
        unnamed = http.post("/pooling", json={"input": "x"}).json()["model"]
        assert unnamed == fake.requests[-1].model  # none asked: the model's own name
        by_url = http.post("/invocations", params={"model": "text-embedding-3-small"}, json={"input": "x"})
        assert by_url.status_code == 200 and by_url.json()["model"] == "text-embedding-3-small", by_url.text
        invoked = http.post("/invocations", json={"model": "shared", "input": "x", "task": "embed"})
        assert invoked.status_code == 200 and fake.requests[-1].model == "emb"
        assert "embedding" in invoked.json()["data"][0]  # vLLM's order all the same: /v1/embeddings' answer
        assert http.post("/tokenize", json={"model": "text-embedding-3-small", "prompt": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb_tokenizer"

    # The Python client's service, over the same fake: the same names, the labels of the model that answered.
    import asyncio

    from pooltriton.client.service import PoolingService

    async def client_side() -> None:
        service = PoolingService(fake, model=None)
        assert (await service.info("shared", "classify")).name == "cls"
        assert (await service.info("shared", "classify")).labels == ("no", "yes")
        assert (await service.info("text-embedding-3-small")).name == "emb"
        scored = await service.score("q", ["d"], model="shared")
        assert fake.requests[-1].model == "emb_score" and scored.values.shape == (1,)
        await service.tokenize("x", model="text-embedding-3-small")
        assert fake.requests[-1].model == "emb_tokenizer"

    asyncio.run(client_side())


@pytest.mark.parametrize("name", ["../emb", "emb/../../x", "a b"])
def test_model_names_are_validated(http, name: str) -> None:
    response = http.post("/v1/embeddings", json={"model": name, "input": "x"})
    assert response.status_code == 400 and "invalid model name" in response.json()["error"]["message"]


def test_errors_are_classified_by_status_code(http) -> None:
    bad = http.post("/v1/embeddings", json={"model": "emb", "input": ["ok", "bad"]})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "text 0 is bad"
    busy = http.post("/v1/embeddings", json={"model": "emb", "input": "busy"})  # UNAVAILABLE from a ready server
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["type"] == "rate_limit_error"
    assert http.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404


@pytest.mark.parametrize("path, body, status, shape", [
    ("/rerank", {"model": "emb", "query": "q", "texts": "not a list"}, 422, "tei"),
    ("/rerank", {"model": "emb", "query": "q", "documents": 5}, 400, "openai"),
    ("/rerank", {"model": "emb", "texts": ["a"]}, 422, "tei"),  # no query: still TEI's body
    ("/tokenize", {"model": "emb", "inputs": 5}, 422, "tei"),
    ("/tokenize", {"model": "emb", "prompt": 5}, 400, "openai"),
    ("/tokenize", [1, 2], 400, "openai"),  # no body of either: vLLM's, the default
])
def test_a_shared_path_answers_an_invalid_body_in_its_dialects_shape(http, path, body, status, shape) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    if shape == "tei":
        assert set(response.json()) == {"error", "error_type"} and response.json()["error_type"] == "Validation"
    else:
        assert response.json()["error"]["type"] == "invalid_request_error", response.text


def test_every_route_documents_its_answer_and_its_invalid_body(http) -> None:
    spec = http.get("/openapi.json").json()
    missing = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation["responses"]["200"]["content"]
            if path == "/metrics":
                assert "text/plain" in content
            elif not content.get("application/json", {}).get("schema", {}).get("$ref") and \
                    not content.get("application/json", {}).get("schema", {}).get("anyOf"):
                missing.append(f"{method} {path}")
    assert not missing, missing
    rerank = spec["paths"]["/rerank"]["post"]
    assert {"400", "422"} <= set(rerank["responses"])  # each dialect's shape of an invalid body
    bodies = {ref["$ref"].rsplit("/", 1)[1] for ref in
              rerank["requestBody"]["content"]["application/json"]["schema"]["anyOf"]}
    assert bodies == {"RerankRequest", "TEIRerankRequest"} and bodies <= set(spec["components"]["schemas"])


def test_a_deployment_serves_only_the_dialects_it_turns_on(fake) -> None:
    with TestClient(create_app("unused:0", client=fake, dialects=["tei"])) as tei:
        assert tei.post("/v1/embeddings", json={"model": "emb", "input": "a"}).status_code == 404
        assert tei.post("/embed", json={"model": "emb", "inputs": "a"}).status_code == 200
        # the shared path reads only TEI's body now
        refused = tei.post("/rerank", json={"model": "emb", "query": "q", "documents": ["a"]})
        assert refused.status_code == 422 and refused.json()["error_type"] == "Validation"
        assert tei.get("/health").status_code == 200 and tei.get("/v1/models").status_code == 200
    with TestClient(create_app("unused:0", client=fake, dialects=["openai", "cohere"])) as vllm:
        assert vllm.post("/embed", json={"model": "emb", "inputs": "a"}).status_code == 404
        assert vllm.post("/invocations", json={"model": "emb", "input": "a"}).status_code == 404
        refused = vllm.post("/tokenize", json={"model": "emb", "inputs": "a"})
        assert refused.status_code == 400 and "send one of prompt" in refused.json()["error"]["message"]
        assert vllm.post("/v2/embed", json={"model": "emb", "texts": ["a"]}).status_code == 200
    with pytest.raises(ValueError, match="unknown dialects"):
        create_app("unused:0", client=fake, dialects=["grpc"])
