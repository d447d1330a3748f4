"""SageMaker's /invocations against a fake Triton client (no server)."""

from __future__ import annotations


def test_invocations_routes_vllms_bodies_then_text_embeddings_inferences(http, fake) -> None:
    """SageMaker's /invocations: the first of vLLM's bodies that validates among those the model serves
    (embeddings, classify, rerank, score, pooling), else TEI's route for the model's kind; errors in OpenAI's shape."""
    def post(body: dict, **params: str):
        response = http.post("/invocations", json=body, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    assert post({"model": "emb", "input": "abc"})["data"][0]["embedding"] == [3, 4, 5, 6]
    assert post({"input": "abc"}, model="emb")["data"][0]["object"] == "embedding"
    assert post({"model": "cls", "input": "abc"})["data"][0]["label"] == "yes"
    assert post({"input": "abc"})["data"][0]["label"] == "yes"  # no model: the first served, cls
    assert [r["index"] for r in post({"model": "emb", "query": "q", "documents": ["long", "a"]})["results"]] == [1, 0]
    assert len(post({"model": "emb", "text_1": "q", "text_2": ["a", "b"]})["data"]) == 2
    assert post({"model": "emb", "inputs": "abc"}) == [[3, 4, 5, 6]]  # TEI's /embed
    assert post({"model": "cls", "inputs": ["abc", "de"]})[0]["label"] == "yes"  # TEI's pair on /predict
    refused = http.post("/invocations", json={"model": "emb"})
    assert refused.status_code == 400 and "takes one of EmbeddingRequest, RerankRequest, ScoreRequest, " \
        "PoolingRequest (vLLM's), or text-embeddings-inference's (`inputs`" in refused.json()["error"]["message"]
    typo = http.post("/invocations", json={"model": "emb", "input": 5})  # vLLM's body, wrong: not TEI's error
    assert typo.status_code == 400 and "no handler for this body" in typo.json()["error"]["message"]
    assert http.post("/invocations", json={"model": "emb", "inputs": 5}).status_code == 400  # TEI's, wrong
    assert http.post("/invocations", json={"model": "nope", "input": "a"}).status_code == 404
