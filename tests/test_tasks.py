"""Every task, pooling type and architecture family, served through Triton, equals transformers /
sentence-transformers on the same (tiny, seeded) weights, for both the ONNX and TorchScript encoders.

References are computed here one text at a time (no padding at all), so they also check that the
served path's batching, padding and real-token selection change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import FAMILIES, build, build_cross_encoder, token_id, with_chat_template
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from pooltriton.client import PoolingClient
from pooltriton.core.activation import normalize, sigmoid, softmax
from pooltriton.export.build import ExportOptions
from pooltriton.export.defaults import minilm_path, rampart_path

from conftest import export_all, running_gateway, start_server
from corpus import varied_texts

COSINE_MIN, MAX_ABS = 0.99999, 1e-5


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    head: str  # what the checkpoint is: embed (base model), classify, token_classify, causal
    reference: str  # how to compute the expected answer
    num_labels: int = 3
    st_pooling: str | None = None
    options: dict = field(default_factory=dict)


CASES = [
    Case("bert_cls", "bert", "embed", "CLS", options={"matryoshka_dimensions": (16,)}),
    Case("bert_mean", "bert", "embed", "sentence-transformers", st_pooling="mean_tokens"),
    Case("xlmr_embed", "xlmr", "embed", "CLS"),
    Case("distilbert_embed", "distilbert", "embed", "CLS"),
    Case("gpt2_embed", "gpt2", "embed", "LAST"),
    Case("qwen2_embed", "qwen2", "causal", "LAST"),  # a *ForCausalLM converted to embed
    Case("llama_embed", "llama", "causal", "LAST"),
    *[Case(f"{f}_classify", f, "classify", "classify") for f in FAMILIES],
    # Saved by sentence-transformers' CrossEncoder (modules.json, its activation in its own config file).
    Case("bert_cross", "bert", "cross_encoder", "classify", num_labels=1),
    # Decoders too: transformers' GPT2/Qwen2/LlamaForTokenClassification (causal, a head on every token).
    *[Case(f"{f}_ner", f, "token_classify", "token_classify") for f in FAMILIES],
    Case("qwen2_tokens", "qwen2", "embed", "token_embed", options={"task": "token_embed"}),
    Case("llama_reward", "llama", "causal", "reward", options={"task": "token_classify", "pooling_type": "STEP"}),
    # The real models too, so that both encoder formats are checked on them.
    Case("real_minilm", "minilm", "real", "sentence-transformers"),
    Case("real_rampart", "rampart", "real", "token_classify", num_labels=35),
]
REAL_MODELS = {"minilm": minilm_path, "rampart": rampart_path}


def texts_for(case: Case) -> list[str]:
    texts = varied_texts(10, seed=11, max_words=18)
    if case.reference == "reward":
        texts = [f"{t} <step> two <step>" if i % 3 else f"one <step> {t}" for i, t in enumerate(texts)]
    return texts


def export_options(case: Case, folder: Path) -> dict:
    options = dict(case.options)
    if case.reference == "reward":
        options.update(step_tag_id=token_id(folder, "<step>"),
                       returned_token_ids=(token_id(folder, "<good>"), token_id(folder, "<bad>")))
    return options


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny_models")
    for case in CASES:
        folder_of(root, case)
    return root


def folder_of(root: Path, case: Case) -> Path:
    if case.head == "real":
        return REAL_MODELS[case.family]()
    if case.head == "cross_encoder":
        return build_cross_encoder(root, case.family, case.num_labels)
    return build(root, case.family, case.head, case.num_labels, sentence_transformers_pooling=case.st_pooling)


@pytest.fixture(scope="module", params=["onnx", "openvino", "torchscript"])
def served(request, tiny_root: Path, tmp_path_factory: pytest.TempPathFactory):
    runtime = request.param
    repository = tmp_path_factory.mktemp(f"repo_{runtime}")
    folders = [(case, folder_of(tiny_root, case)) for case in CASES]
    jobs = [(folder, ExportOptions(name=case.name, out=repository, runtime=runtime, **export_options(case, folder)))
            for case, folder in folders]
    # Three labels: sentence-transformers saves (and applies) Identity, where vLLM's default is softmax.
    jobs.append((build_cross_encoder(tiny_root, "bert", 3), ExportOptions(name="bert_cross3", out=repository,
                                                                          runtime=runtime)))
    if runtime == "torchscript":  # vLLM's chat form: rendering does not depend on the runtime
        jobs += [(chat_folder(tiny_root, name), ExportOptions(name=name, out=repository, runtime=runtime))
                 for name in CHAT_CASES]
    export_all(jobs)
    server = start_server(repository, repository / "server.log")
    client = PoolingClient(server.grpc_url, protocol="grpc")
    yield runtime, client, server, repository
    client.close()
    assert server.stop() == 0


# Chat-form models: a Qwen2 decoder embedding (LAST) and a Llama classifier, each with its family's chat template.
CHAT_CASES = {"qwen2_chat": "qwen2_embed", "llama_chat": "llama_classify"}


def chat_folder(root: Path, name: str) -> Path:
    case = next(c for c in CASES if c.name == CHAT_CASES[name])
    return with_chat_template(folder_of(root, case), case.family)


def test_torchscript_encoders_name_their_arguments_as_their_config_inputs(served) -> None:
    """Triton's native libtorch backend (the GPU image) binds inputs by the names of forward's arguments
    (else by <name>__<index>): every TorchScript encoder's must be its config's inputs, in order."""
    from pooltriton.contract.config import parse_config

    runtime, _client, _server, repository = served
    if runtime != "torchscript":
        pytest.skip("TorchScript exports only")
    encoders = sorted(repository.glob("*_encoder/1/model.pt"))
    assert len(encoders) >= 5
    seen = set()
    for path in encoders:
        inputs = [tensor.name for tensor in parse_config(path.parent.parent / "config.pbtxt").input]
        arguments = [argument.name for argument in torch.jit.load(str(path)).forward.schema.arguments][1:]
        assert arguments == inputs, path
        seen.add(tuple(inputs))
    assert len(seen) >= 2  # with and without token_type_ids / activate


def library_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer the model's users run (transformers' AutoTokenizer, as vLLM loads it), independent of
    the served tokenizer.json: for Qwen2 transformers builds the pipeline from code."""
    return AutoTokenizer.from_pretrained(folder)


def reference(case: Case, folder: Path, texts: list[str], pairs: list[str] | None = None,
              dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    """The answer per text from transformers (or sentence-transformers), batch of one, no padding; `dtype`
    (transformers only) float64 for a reference without fp32's rounding."""
    if case.reference == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        return list(SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True))
    tokenizer = library_tokenizer(folder)
    loader = {"classify": AutoModelForSequenceClassification, "token_classify": AutoModelForTokenClassification,
              "reward": AutoModelForCausalLM}.get(case.reference, AutoModel)
    model = loader.from_pretrained(folder).eval().to(dtype)
    model = getattr(model, "base_model", model) if loader is AutoModel else model
    answers = []
    for index, text in enumerate(texts):
        encoded = tokenizer(text, pairs[index], return_tensors="pt") if pairs else tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            output = model(**encoded)
        if case.reference in ("CLS", "LAST", "token_embed"):
            hidden = output.last_hidden_state[0].numpy()
            vector = {"CLS": hidden[:1], "LAST": hidden[-1:], "token_embed": hidden}[case.reference]
            answers.append(normalize(vector)[0] if case.reference != "token_embed" else normalize(vector))
        elif case.reference == "classify":
            logits = output.logits[0].numpy()
            answers.append(sigmoid(logits) if case.num_labels == 1 else softmax(logits))
        elif case.reference == "token_classify":
            answers.append(softmax(output.logits[0].numpy()))
        else:  # reward: LM-head logits of the good/bad ids at each step tag, softmaxed
            ids = encoded["input_ids"][0].numpy()
            columns = [token_id(folder, "<good>"), token_id(folder, "<bad>")]
            logits = output.logits[0].numpy()[ids == token_id(folder, "<step>")][:, columns]
            answers.append(softmax(logits))
    return answers


def assert_matches(case: Case, served: list[np.ndarray] | np.ndarray, expected: list[np.ndarray]) -> None:
    assert len(served) == len(expected)
    for index, (got, want) in enumerate(zip(served, expected)):
        assert got.shape == want.shape, (case.name, index, got.shape, want.shape)
        assert np.abs(got - want).max() <= MAX_ABS, (case.name, index, float(np.abs(got - want).max()))
        if case.reference in ("CLS", "LAST", "sentence-transformers", "token_embed"):
            rows_got, rows_want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
            cosine = np.sum(rows_got * rows_want, -1) / (
                np.linalg.norm(rows_got, axis=-1) * np.linalg.norm(rows_want, axis=-1))
            assert cosine.min() >= COSINE_MIN, (case.name, index, float(cosine.min()))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_served_equals_reference(served, tiny_root: Path, case: Case) -> None:
    _runtime, client, _server, _repository = served
    folder = folder_of(tiny_root, case)
    texts = texts_for(case)
    expected = reference(case, folder, texts)
    got = client.encode(texts, model=case.name)
    try:
        assert_matches(case, got if isinstance(got, list) else list(got), expected)
    except AssertionError as error:  # which side is off: the served answer, or transformers' own fp32 one
        if case.reference == "sentence-transformers" or any(g.shape != e.shape for g, e in zip(got, expected)):
            raise
        exact = reference(case, folder, texts, dtype=torch.float64)
        served_off = [float(np.abs(g - e).max()) for g, e in zip(got, exact)]
        reference_off = [float(np.abs(r - e).max()) for r, e in zip(expected, exact)]
        raise AssertionError(f"{error}; against transformers in fp64, max |served - fp64| per text {served_off}, "
                             f"max |fp32 reference - fp64| {reference_off}") from None
    # The answers are not trivially equal across texts (a test that cannot fail is a defect).
    size = min(e.size for e in expected)
    probes = np.array([np.ravel(e)[np.linspace(0, size - 1, 16).astype(int)] for e in expected])
    assert np.ptp(probes, axis=0).max() > 1e-3, "reference outputs barely vary: the comparison would be weak"


def test_use_activation_false_returns_logits(served, tiny_root: Path) -> None:
    _runtime, client, _server, _repository = served
    case = next(c for c in CASES if c.name == "qwen2_classify")
    folder = folder_of(tiny_root, case)
    tokenizer = library_tokenizer(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    texts = texts_for(case)[:4]
    with torch.no_grad():
        logits = np.stack([model(**tokenizer(t, return_tensors="pt")).logits[0].numpy() for t in texts])
    raw = client.encode(texts, model=case.name, use_activation=False)
    assert np.abs(raw - logits).max() <= MAX_ABS


def test_labels_come_back_with_probabilities(served) -> None:
    _runtime, client, _server, _repository = served
    result = client.classify(["one two three"], model="bert_classify")
    assert result.labels == ("LABEL_A", "LABEL_B", "LABEL_C")
    assert result.top()[0][0] in result.labels
    tokens = client.classify_tokens(["one two three"], model="bert_ner")
    assert len(tokens.tags()[0]) == 5  # [CLS] one two three [SEP]


def test_cross_encoder_equals_sentence_transformers(served, tiny_root: Path) -> None:
    from sentence_transformers import CrossEncoder

    _runtime, client, _server, repository = served
    case = next(c for c in CASES if c.name == "bert_cross")
    folder = folder_of(tiny_root, case)
    query = "relevant query"
    documents = [" ".join(w for w in t.split() if w.isascii() and w.isalpha()) or "answer"
                 for t in varied_texts(6, seed=5, max_words=12)]
    cross_encoder = CrossEncoder(str(folder), device="cpu")
    # The served tokenizer (the repository's file) makes the library's pairs.
    ours = PreTrainedTokenizerFast(tokenizer_file=str(repository / "bert_cross_tokenizer" / "1" / "tokenizer.json"))
    for document in documents:
        assert cross_encoder.tokenizer(query, document)["input_ids"] == ours(query, document)["input_ids"]
    expected = cross_encoder.predict([(query, d) for d in documents])
    scores = client.score(query, documents, model="bert_cross")  # 1:N
    assert np.abs(scores - expected).max() <= MAX_ABS
    zipped = client.score([query] * 3, documents[:3], model="bert_cross")  # N:N
    assert np.abs(zipped - expected[:3]).max() <= MAX_ABS
    single = client.score(query, documents[0], model="bert_cross")  # 1:1
    assert np.abs(single - expected[:1]).max() <= MAX_ABS
    pairs = client.classify([query] * len(documents), model="bert_cross", pairs=documents)
    assert np.abs(pairs.probabilities[:, 0] - expected).max() <= MAX_ABS
    ranked = client.rerank(query, documents, model="bert_cross", top_n=3)
    assert [r.index for r in ranked] == list(np.argsort(-expected, kind="stable")[:3])
    three = CrossEncoder(str(build_cross_encoder(tiny_root, "bert", 3)), device="cpu")
    logits = three.predict([(query, d) for d in documents])
    served3 = client.classify([query] * len(documents), model="bert_cross3", pairs=documents).probabilities
    assert np.abs(served3 - logits).max() <= MAX_ABS and np.abs(served3.sum(axis=1) - 1).max() > 0.1


def test_late_interaction_is_maxsim(served) -> None:
    _runtime, client, _server, _repository = served
    query, documents = "one two query", varied_texts(4, seed=9, max_words=10)
    tokens = client.encode([query, *documents], model="qwen2_tokens")
    expected = [float((tokens[0] @ d.T).max(axis=1).sum()) for d in tokens[1:]]
    np.testing.assert_allclose(client.score(query, documents, model="qwen2_tokens"), expected, rtol=1e-5, atol=1e-5)


def test_scoring_shape_mismatch_is_a_clear_error(served) -> None:
    from tritonclient.utils import InferenceServerException

    _runtime, client, _server, _repository = served
    with pytest.raises(InferenceServerException, match="2 queries and 3 documents"):
        client.score(["a", "b"], ["x", "y", "z"], model="bert_cross")


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "llama"])
def test_last_pooling_takes_the_last_real_token_under_either_padding_side(tiny_root: Path, family: str) -> None:
    """The exported graph's mask and positions make left- and right-padded rows answer alike."""
    from pooltriton.core.resolve import resolve
    from pooltriton.export.encoder import load_encoder

    case = next(c for c in CASES if c.family == family and c.reference == "LAST")
    folder = folder_of(tiny_root, case)
    encoder = load_encoder(folder, resolve(folder))
    ids = torch.tensor([[7, 8, 9, 10, 11], [12, 13, 14, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    left_ids = torch.tensor([[7, 8, 9, 10, 11], [0, 0, 12, 13, 14]])
    left_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        right, left = encoder(ids, mask), encoder(left_ids, left_mask)
        alone = encoder(ids[1:, :3], mask[1:, :3])
    assert torch.allclose(right, left, atol=1e-5) and torch.allclose(right[1], alone[0], atol=1e-5)


def test_score_cuts_each_query_and_document_to_its_own_tokens(served, tiny_root: Path) -> None:
    """vLLM's max_tokens_per_doc / max_tokens_per_query: a cross-encoder reads each pair as transformers'
    tokenizer truncates it (only_second / only_first), a bi-encoder each side as sentence-transformers reads
    it at that max_seq_length; the limits change the scores (the texts are longer than them)."""
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from tritonclient.utils import InferenceServerException

    _runtime, client, _server, _repository = served
    query = "query one two three four five six seven"
    documents = [t for t in varied_texts(40, seed=3, max_words=30) if len(t.split()) >= 12][:6]
    cross = CrossEncoder(str(folder_of(tiny_root, next(c for c in CASES if c.name == "bert_cross"))), device="cpu")
    tokenizer = cross.tokenizer
    assert min(len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in documents) > 6

    def cross_reference(strategy: str, max_lengths: list[int]) -> np.ndarray:
        scores = []
        for document, max_length in zip(documents, max_lengths):
            features = tokenizer(query, document, truncation=strategy, max_length=max_length, return_tensors="pt")
            with torch.no_grad():
                scores.append(float(cross.activation_fn(cross.model(**features).logits[0, 0])))
        return np.array(scores)

    query_length = len(tokenizer(query)["input_ids"])  # [CLS] query [SEP]; the pair adds the document and [SEP]
    expected = cross_reference("only_second", [query_length + 6 + 1] * len(documents))
    scores = client.score(query, documents, model="bert_cross", max_tokens_per_doc=6)
    assert np.abs(scores - expected).max() <= MAX_ABS
    assert np.abs(scores - client.score(query, documents, model="bert_cross")).max() > 100 * MAX_ABS
    expected = cross_reference("only_first", [len(tokenizer(d)["input_ids"]) + 3 + 1 for d in documents])
    assert np.abs(client.score(query, documents, model="bert_cross", max_tokens_per_query=3) - expected).max() \
        <= MAX_ABS
    # A bi-encoder: each side embedded alone, cut to its own limit.
    encoder = SentenceTransformer(str(folder_of(tiny_root, next(c for c in CASES if c.name == "bert_mean"))),
                                  device="cpu")
    encoder.max_seq_length = 6 + 2
    vectors = encoder.encode(documents, normalize_embeddings=True)
    encoder.max_seq_length = 3 + 2
    expected = vectors @ encoder.encode([query], normalize_embeddings=True)[0]
    scores = client.score(query, documents, model="bert_mean", max_tokens_per_doc=6, max_tokens_per_query=3)
    assert np.abs(scores - expected).max() <= MAX_ABS
    assert np.abs(scores - client.score(query, documents, model="bert_mean")).max() > 100 * MAX_ABS
    # truncation_side left: each document from where its 7th token from the end ends (transformers' offsets),
    # where that reads again as 6 tokens (a word cut in two may not, and is cut again).
    encoder.max_seq_length = 256
    left = client.score(query, documents, model="bert_mean", max_tokens_per_doc=6, truncation_side="left")
    query_vector = encoder.encode([query], normalize_embeddings=True)[0]
    checked = 0
    for document, score in zip(documents, left):
        offsets = encoder.tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        tail = document[offsets[-7][1] :]
        if len(encoder.tokenizer(tail, add_special_tokens=False)["input_ids"]) == 6:
            assert abs(score - encoder.encode([tail], normalize_embeddings=True)[0] @ query_vector) <= MAX_ABS
            checked += 1
    assert checked >= 3
    with pytest.raises(InferenceServerException, match="max_tokens_per_doc"):
        client.score(query, documents, model="bert_cross", max_tokens_per_doc=-2)


def test_gateway_classify_and_cross_encoder_rerank(served, tiny_root: Path) -> None:
    """The gateway's /classify and /rerank routes on classifiers (the default repository has none)."""
    import httpx

    _runtime, client, server, _repository = served
    case = next(c for c in CASES if c.name == "llama_classify")
    texts = texts_for(case)[:4]
    expected = reference(case, folder_of(tiny_root, case), texts)
    with running_gateway(server.grpc_url, admin_key=server.admin_key) as url:
        body = httpx.post(f"{url}/classify", json={"model": "llama_classify", "input": texts}, timeout=60).json()
        probabilities = np.array([d["probs"] for d in body["data"]])
        assert np.abs(probabilities - np.array(expected)).max() <= MAX_ABS
        assert [d["label"] for d in body["data"]] == [f"LABEL_{chr(65 + int(p.argmax()))}" for p in expected]
        documents = ["one two", "three dog", "the river"]
        scores = client.score("query one", documents, model="bert_cross")
        ranked = httpx.post(f"{url}/v2/rerank", json={"model": "bert_cross", "query": "query one",
                                                     "documents": documents}, timeout=60).json()["results"]
        assert [r["index"] for r in ranked] == list(np.argsort(-scores, kind="stable"))
        assert np.abs(np.array([r["relevance_score"] for r in ranked]) - np.sort(scores)[::-1]).max() <= 1e-6
        # TEI's /rerank body: the cross-encoder's logit through TEI's sigmoid (raw_scores: the logit itself)
        logits = client.score("query one", documents, model="bert_cross", use_activation=False)
        for raw, expected_scores in ((False, 1 / (1 + np.exp(-logits))), (True, logits)):
            tei = httpx.post(f"{url}/rerank", json={"model": "bert_cross", "query": "query one", "texts": documents,
                                                    "raw_scores": raw}, timeout=60).json()
            got = np.array([r["score"] for r in sorted(tei, key=lambda r: r["index"])])
            assert np.abs(got - expected_scores).max() <= 1e-6, (raw, got, expected_scores)
        # Matryoshka: a model exported with --matryoshka-dimensions 16 cuts and re-normalises.
        bert = next(c for c in CASES if c.name == "bert_cls")
        full = np.array(reference(bert, folder_of(tiny_root, bert), texts))
        body = httpx.post(f"{url}/v1/embeddings", json={"model": "bert_cls", "input": texts, "dimensions": 16},
                          timeout=60).json()
        np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), normalize(full[:, :16]),
                                   atol=1e-5)
        # The same cut from the Python client: one service under both.
        np.testing.assert_allclose(client.embed(texts, model="bert_cls", dimensions=16), normalize(full[:, :16]),
                                   atol=1e-5)
        refused = httpx.post(f"{url}/v1/embeddings", json={"model": "bert_cls", "input": texts, "dimensions": 8})
        assert refused.status_code == 400 and "only [16]" in refused.json()["error"]["message"]


def test_vllms_chat_form_is_the_models_template_rendered_then_served(served, tiny_root: Path) -> None:
    """`messages` in place of `input` (vLLM's chat form) on /v1/embeddings, /pooling, /classify, /tokenize and
    /invocations: equal to transformers' apply_chat_template(..., tokenize=False), tokenized without special
    tokens, through the model (vLLM's own equivalence); a list of text parts read as vLLM reads it for a
    template that reads strings (joined by new lines)."""
    import httpx

    runtime, _client, server, _repository = served
    if runtime != "torchscript":
        pytest.skip("the chat-form models are exported to the TorchScript server only")
    question = varied_texts(1, seed=21, max_words=8)[0]
    # (short: each of ChatML's markers is 9 tokens of the tiny vocabulary, and the model reads 128)
    sent = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": question}, {"type": "text", "text": "Runtime?"}]}]
    read = [sent[0], {"role": "user", "content": f"{question}\nRuntime?"}]  # what vLLM hands the template

    def library_ids(name: str, messages: list[dict], generation: bool = False) -> list[int]:
        tokenizer = library_tokenizer(chat_folder(tiny_root, name))
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    qwen2 = AutoModel.from_pretrained(chat_folder(tiny_root, "qwen2_chat")).eval()
    llama = AutoModelForSequenceClassification.from_pretrained(chat_folder(tiny_root, "llama_chat")).eval()

    def embedding(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return normalize(qwen2.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1:].numpy())[0]

    with running_gateway(server.grpc_url, admin_key=server.admin_key) as url:
        def post(route: str, body: dict) -> httpx.Response:
            return httpx.post(f"{url}{route}", json=body, timeout=60)

        ids = library_ids("qwen2_chat", read)
        assert 30 < len(ids) < 110, len(ids)
        for generation in (False, True):
            answer = post("/v1/embeddings", {"model": "qwen2_chat", "messages": sent,
                                             "add_generation_prompt": generation}).json()
            assert "data" in answer, answer
            expected = embedding(library_ids("qwen2_chat", read, generation))
            assert np.abs(np.array(answer["data"][0]["embedding"]) - expected).max() <= MAX_ABS
            assert answer["usage"]["prompt_tokens"] == len(library_ids("qwen2_chat", read, generation))
        pooled = post("/pooling", {"model": "qwen2_chat", "messages": sent, "task": "embed"}).json()
        assert np.abs(np.array(pooled["data"][0]["data"]) - embedding(ids)).max() <= MAX_ABS
        invoked = post("/invocations", {"model": "qwen2_chat", "messages": sent}).json()
        assert np.abs(np.array(invoked["data"][0]["embedding"]) - embedding(ids)).max() <= MAX_ABS
        # vLLM's truncate_prompt_tokens cuts the rendered conversation's tokens (its first ones)
        cut = post("/v1/embeddings", {"model": "qwen2_chat", "messages": sent, "truncate_prompt_tokens": 12}).json()
        assert np.abs(np.array(cut["data"][0]["embedding"]) - embedding(ids[:12])).max() <= MAX_ABS
        # /tokenize's chat form adds the generation prompt by default, as vLLM's
        tokens = post("/tokenize", {"model": "qwen2_chat", "messages": sent}).json()
        assert tokens["tokens"] == library_ids("qwen2_chat", read, generation=True)
        # a classifier: Llama's template (bos_token, alternating roles)
        turns = [{"role": "user", "content": question}, {"role": "assistant", "content": "A server."},
                 {"role": "user", "content": "And ONNX Runtime?"}]
        with torch.no_grad():
            logits = llama(input_ids=torch.tensor([library_ids("llama_chat", turns)])).logits[0].numpy()
        classified = post("/classify", {"model": "llama_chat", "messages": turns}).json()
        assert np.abs(np.array(classified["data"][0]["probs"]) - softmax(logits)).max() <= MAX_ABS
        # what cannot be rendered: 400s that say why
        refusals = [("/v1/embeddings", {"model": "bert_cls", "messages": turns}, "no longer allowed"),
                    ("/classify", {"model": "llama_chat", "messages": turns[1:]}, "roles must alternate"),
                    ("/v1/embeddings", {"model": "qwen2_chat", "messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "not a multimodal model"),
                    ("/v1/embeddings", {"model": "qwen2_chat", "messages": turns, "chat_template": "{{ 1 }}"},
                     "untrusted chat template"),
                    ("/v1/embeddings", {"model": "qwen2_chat", "messages": turns, "input": "x"}, "one of input")]
        for route, body, message in refusals:
            refused = post(route, body)
            assert refused.status_code == 400 and message in refused.json()["error"]["message"], refused.text
