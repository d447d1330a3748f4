"""The architectures people bring today: tiny seeded models at a scale where numerics matter
(hidden 128, 4 heads, 3 layers) with attention windows (8 tokens) shorter than the test texts, exported
to ONNX and TorchScript, served by Triton, and equal to transformers' own classes on the same weights.

The references run each text alone, unpadded, with transformers' own masks and default attention, so a
lost sliding window, a wrong causal flag, a skipped head or a position offset shows here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from alibaba_gte import alibaba_gte, alibaba_gte_logits, build_alibaba_gte
from tiny_models import MODERN, STATIC_LAYOUTS, WINDOW, build, build_m3, build_sparse, build_st, build_static
from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

from pooltriton.client import PoolingClient
from pooltriton.core.activation import normalize, softmax
from pooltriton.core.resolve import resolve
from pooltriton.export.build import ExportOptions

from conftest import export_all, start_server
from corpus import varied_texts

MAX_ABS = 1e-5
# transformers has no token-classification class for Gemma 3; BART is served as a classifier only
# (bart-large-mnli's head at the decoder's last </s>).
CASES = [(family, head) for head in ("embed", "classify", "token_classify") for family in MODERN
         if not (head == "token_classify" and family.startswith("gemma3"))] + [("bart", "classify")]
TEXTS = varied_texts(12, seed=5, max_words=40)
# A Qwen3-Reranker-style prompt in the tiny vocabulary: the model answers "yes" or "no" after it.
RERANK_TEMPLATE = "query: {query} document: {document} relevant answer"
# (model, family, --classifier-from-tokens): Qwen3-Reranker's two tokens, bge-reranker-v2-gemma's one,
# mxbai-rerank-v2's "0" and "1" on Qwen2; a Gemma 2 one soft-caps its logits (final_logit_softcapping)
# before the difference.
RERANKERS = [("qwen3_reranker", "qwen3", ("no", "yes")), ("gemma_reranker", "gemma", ("yes",)),
             ("gemma2_reranker", "gemma2", ("no", "yes")), ("qwen2_reranker", "qwen2", ("0", "1"))]
# sentence-transformers pipelines: every Pooling mode, a Dense after pooling (one with use_residual and the
# library's default activation), with and without Normalize,
# and T5's encoder as sentence-transformers loads it (T5EncoderModel).
ST_CASES = [("bert", "max", False, True), ("bert", "mean_sqrt_len_tokens", False, True),
            ("bert", "weightedmean", False, True), ("qwen2", "lasttoken", False, True),
            ("bert", "mean", "residual", False), ("xlmr", "cls", True, True),
            ("t5", "mean", True, True)]  # sentence-t5 / GTR: T5's encoder, mean, Dense, Normalize


# BGE-M3 as one folder exported three times: its dense embedding, its lexical weights, its ColBERT vectors;
# the last two also answer to the first's name (--served-model-name m3), told apart by the task asked.
M3_MODELS = (("m3", None), ("m3_sparse", "token_classify"), ("m3_colbert", "token_embed"))
# SparseEncoder's pooling strategy served by each server (see the served fixture).
SPLADE = {"onnx": "max", "torchscript": "sum"}


def name_of(family: str, head: str) -> str:
    return f"{family}_{head}"


def st_name(family: str, mode: str, dense: bool | str, normalize: bool) -> str:
    kind = ("_" + dense if isinstance(dense, str) else "_dense") if dense else ""
    return f"st_{family}_{mode}{kind}{'' if normalize else '_raw'}"


@pytest.fixture(scope="session")
def modern_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("modern_models")
    for family, head in CASES:
        build(root, family, head)
    return root


@pytest.fixture(scope="module", params=["onnx", "torchscript"])
def served(request, modern_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every family and task in both formats. The sentence-transformers pipelines (pooling modes inside
    the graph) go to the ONNX server, the prompts and the reranker (stages around an ordinary graph) to
    the TorchScript one: an ONNX export costs ~10 s here, a TorchScript one ~1 s. One tokenizer instance
    each: a server of ~100 models starts a stub per instance, and what a model computes does not depend
    on how many tokenize for it."""
    runtime = request.param
    repository = tmp_path_factory.mktemp(f"modern_{runtime}")
    jobs = [(build(modern_root, family, head), ExportOptions(name=name_of(family, head), out=repository,
                                                             runtime=runtime, tokenizer_instances=1))
            for family, head in CASES]
    # Alibaba's own GTE (model_type `new`), read as transformers' gte.
    jobs += [(build_alibaba_gte(modern_root, head), ExportOptions(name=f"alibaba_gte_{head}", out=repository,
                                                                  runtime=runtime, tokenizer_instances=1))
             for head in ("embed", "classify")]
    # sentence-transformers' StaticEmbedding as each kind of checkpoint lays it out (a lookup: ~1 s each).
    jobs += [(build_static(modern_root, layout), ExportOptions(name=f"static_{layout}", out=repository,
                                                               runtime=runtime, tokenizer_instances=1))
             for layout in STATIC_LAYOUTS]
    # SPLADE, saved by SparseEncoder: its max on one server, its sum on the other.
    jobs.append((build_sparse(modern_root, "bert", SPLADE[runtime]), ExportOptions(
        name="splade", out=repository, runtime=runtime, tokenizer_instances=1)))
    jobs += [(build_m3(modern_root), ExportOptions(name=name, out=repository, runtime=runtime, task=task,
                                                   allow_pickle=True, tokenizer_instances=1,
                                                   served_model_names=("m3",) if task else ()))
             for name, task in M3_MODELS]
    if runtime == "onnx":
        jobs += [(build_st(modern_root, *case), ExportOptions(name=st_name(*case), out=repository, runtime=runtime,
                                                              tokenizer_instances=1)) for case in ST_CASES]
    else:
        t5 = next(case for case in ST_CASES if case[0] == "t5")  # T5 in both formats
        jobs.append((build_st(modern_root, *t5), ExportOptions(name=st_name(*t5), out=repository, runtime=runtime,
                                                               tokenizer_instances=1)))
        jobs.append((build_st(modern_root, "bert", "mean", prompts=True),
                     ExportOptions(name="st_prompts", out=repository, runtime=runtime, tokenizer_instances=1)))
        jobs += [(build(modern_root, family, "causal"), ExportOptions(
            name=name, out=repository, runtime=runtime, classifier_from_tokens=tokens,
            score_template=RERANK_TEMPLATE, tokenizer_instances=1)) for name, family, tokens in RERANKERS]
    export_all(jobs)
    # Folders that are no models (a volume's lost+found, a killed export's): Triton's own --load-model=*
    # failed to start on them; the server loads the repository's models only.
    (repository / "lost+found").mkdir()
    (repository / ".pooltriton-export-incoming~1.x" / "m_encoder" / "1").mkdir(parents=True)
    server = start_server(repository, repository / "server.log")
    client = PoolingClient(server.grpc_url, protocol="grpc")
    client.served_by = server  # the gateway tests reach the same server (its admin key included)
    client.runtime = runtime
    yield client
    client.close()
    assert server.stop() == 0


def only_on(served, runtime: str) -> None:
    if served.runtime != runtime:
        pytest.skip(f"exported to the {runtime} server only (see the served fixture)")


def reference(folder: Path, head: str, texts: list[str]) -> list[np.ndarray]:
    """transformers' own model per text, vLLM's semantics on top (the resolved default pooling)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    loader = {"embed": AutoModel, "classify": AutoModelForSequenceClassification,
              "token_classify": AutoModelForTokenClassification}[head]
    model = loader.from_pretrained(folder).eval()
    pooling = resolve(folder).pooling_type.value
    answers = []
    for text in texts:
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            output = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
        if head == "embed":
            hidden = output.last_hidden_state[0].numpy()
            answers.append(normalize(hidden[:1] if pooling == "CLS" else hidden[-1:])[0])
        else:
            answers.append(softmax(output.logits[0].numpy()))
    return answers


@pytest.mark.parametrize(("family", "head"), CASES, ids=[name_of(*case) for case in CASES])
def test_served_equals_transformers(served, modern_root: Path, family: str, head: str) -> None:
    folder = build(modern_root, family, head)
    expected = reference(folder, head, TEXTS)
    got = served.encode(TEXTS, model=name_of(family, head))
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, (index, g.shape, e.shape)
        assert np.abs(g - e).max() <= MAX_ABS, (index, float(np.abs(g - e).max()))


@pytest.mark.parametrize("case", ST_CASES, ids=[st_name(*case) for case in ST_CASES])
def test_sentence_transformers_pipelines_served_as_sentence_transformers_encodes(served, modern_root: Path,
                                                                                 case: tuple) -> None:
    """Pooling modes, Dense (with its activation) and Normalize or its absence, as the library runs them."""
    from sentence_transformers import SentenceTransformer

    if case[0] != "t5":
        only_on(served, "onnx")
    folder = build_st(modern_root, *case)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, batch_size=1)
    got = served.embed(TEXTS, model=st_name(*case))
    assert got.shape == expected.shape and np.abs(got - expected).max() <= MAX_ABS, float(np.abs(got - expected).max())
    _family, _mode, dense, normalize = case
    assert (expected.shape[1] == 24) == bool(dense)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5) == normalize
    # use_activation overrides the model's Normalize (or its absence) either way; the encoder graph
    # normalises per text, so a request asking the opposite of the default gets it too.
    unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    activated = served.embed(TEXTS, model=st_name(*case), use_activation=True)
    assert np.abs(activated - unit).max() <= MAX_ABS
    raw = served.embed(TEXTS, model=st_name(*case), use_activation=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-3)  # the pooled vectors, not unit ones
    assert np.abs(raw / np.linalg.norm(raw, axis=1, keepdims=True) - unit).max() <= MAX_ABS
    if not normalize:
        assert np.abs(raw - expected).max() <= MAX_ABS


def test_bge_m3_heads_are_resolved_from_its_files_and_loaded_only_with_allow_pickle(modern_root: Path) -> None:
    from pooltriton.core.resolve import ResolutionError
    from pooltriton.export.encoder import load_encoder

    folder = build_m3(modern_root)
    sparse, colbert, dense = (resolve(folder, task=task) for task in ("token_classify", "token_embed", None))
    assert (sparse.token_head, sparse.activation.value, sparse.use_activation, sparse.num_labels,
            sparse.drop_first, sparse.drop_last) == ("sparse_linear.pt", "relu", True, 1, 0, 2)
    assert (colbert.token_head, colbert.activation.value, colbert.use_activation, colbert.drop_first,
            colbert.drop_last) == ("colbert_linear.pt", "normalize", True, 0, None)
    assert (dense.task.value, dense.pooling_type.value, dense.token_head) == ("embed", "CLS", None)
    assert sparse.sources["token_head"] == "model-files"
    # --convert embed asks for the encoder's plain hidden states: no head of its files.
    assert resolve(folder, task="token_embed", convert="embed").token_head is None
    with pytest.raises(ResolutionError, match="--allow-pickle"):
        load_encoder(folder, sparse)
    # An XLM-R encoder without the file has no head for a token task.
    with pytest.raises(ResolutionError, match="no classification head"):
        resolve(build(modern_root / "plain_xlmr", "xlmr", "embed"), task="token_classify")


def test_bge_m3_served_as_flagembedding_encodes(served, modern_root: Path) -> None:
    """BGEM3FlagModel (FlagEmbedding, the library BGE-M3 ships with) on the same folder: the dense vectors,
    the lexical weights (a weight per token but <s> and </s>, relu(sparse_linear(h)); as FlagEmbedding
    reports them, the largest per vocabulary id, specials and zeros left out) and the ColBERT vectors
    (normalize(colbert_linear(h)) per token but <s>), as vLLM's BgeM3EmbeddingModel answers them."""
    from FlagEmbedding import BGEM3FlagModel
    from transformers import AutoTokenizer

    folder = build_m3(modern_root)
    model = BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu")
    expected = model.encode(
        TEXTS, batch_size=1, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    dense = served.embed(TEXTS, model="m3")
    assert dense.shape == expected["dense_vecs"].shape
    assert np.abs(dense - expected["dense_vecs"]).max() <= MAX_ABS
    weights = served.encode(TEXTS, model="m3_sparse")
    colbert = served.encode(TEXTS, model="m3_colbert")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    left_out = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    zeros = 0
    for index, text in enumerate(TEXTS):
        ids = tokenizer(text)["input_ids"]
        assert weights[index].shape == (len(ids) - 2,), (index, weights[index].shape)  # vLLM's, squeezed
        ours: dict[str, float] = {}
        for token, weight in zip(ids[1:-1], weights[index]):
            if token not in left_out and weight > 0:
                ours[str(token)] = max(ours.get(str(token), 0.0), float(weight))
        theirs = {key: float(value) for key, value in expected["lexical_weights"][index].items()}
        assert ours and theirs
        for key in ours.keys() | theirs.keys():
            assert abs(ours.get(key, 0.0) - theirs.get(key, 0.0)) <= MAX_ABS, (index, key)
        zeros += int((weights[index] == 0).sum())
        assert colbert[index].shape == expected["colbert_vecs"][index].shape == (len(ids) - 1, dense.shape[1])
        assert np.abs(colbert[index] - expected["colbert_vecs"][index]).max() <= MAX_ABS, index
    assert zeros > 0  # the relu is applied (and some weights are positive, above)
    # Its late interaction: ColBERT's MaxSim sum (vLLM's), FlagEmbedding's colbert_score times the query's tokens.
    query = expected["colbert_vecs"][0]
    scores = served.score(TEXTS[0], TEXTS[1:5], model="m3_colbert")
    wanted = [float(model.colbert_score(query, document)) * len(query) for document in expected["colbert_vecs"][1:5]]
    assert np.abs(np.asarray(scores) - wanted).max() <= MAX_ABS * len(query), (scores, wanted)
    # As a BgeM3EmbeddingModel server is asked: one name, the task picking the output (vLLM's /pooling), the
    # dense vectors from /v1/embeddings.
    import httpx

    from conftest import running_gateway

    with running_gateway(served.served_by.grpc_url, admin_key=served.served_by.admin_key) as base:
        answers = {task: httpx.post(f"{base}/pooling", json={"model": "m3", "input": TEXTS[:2], "task": task},
                                    timeout=60) for task in ("token_classify", "token_embed")}
        embedded = httpx.post(f"{base}/v1/embeddings", json={"model": "m3", "input": TEXTS[:2]}, timeout=60)
    for task, rows in (("token_classify", weights), ("token_embed", colbert)):
        assert answers[task].status_code == 200, answers[task].text
        for item, expected_rows in zip(answers[task].json()["data"], rows[:2]):
            assert np.shape(item["data"]) == expected_rows.shape, task
            assert np.abs(np.asarray(item["data"]) - expected_rows).max() <= 1e-6, task
    assert embedded.status_code == 200, embedded.text
    assert np.abs(np.array([d["embedding"] for d in embedded.json()["data"]]) - dense[:2]).max() <= 1e-6
    # The Python client, with the server's admin key (the repository index), resolves the name the same way.
    client = PoolingClient(served.served_by.grpc_url, protocol="grpc", admin_key=served.served_by.admin_key)
    try:
        for task, rows in (("token_classify", weights), ("token_embed", colbert)):
            got = client.encode(TEXTS[:2], model="m3", task=task)
            assert all(np.abs(g - r).max() <= 1e-6 for g, r in zip(got, rows[:2], strict=True)), task
        assert np.abs(client.embed(TEXTS[:2], model="m3") - dense[:2]).max() <= 1e-6
    finally:
        client.close()


@pytest.mark.parametrize("layout", STATIC_LAYOUTS)
def test_static_embeddings_are_served_as_sentence_transformers_encodes(served, modern_root: Path, layout: str) -> None:
    """A StaticEmbedding (model2vec's potion, static-retrieval-mrl) served as the library computes it: the mean
    of its tokens' rows, without the special tokens its tokenizer.json would add, and its Normalize or none;
    texts up to ~1,000 tokens, as one batch (padding must not count)."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    folder = build_static(modern_root, layout)
    model = SentenceTransformer(str(folder), device="cpu")
    # a text of white space has no tokens at all: the library's mean of nothing is a zero vector
    texts = [*TEXTS, "  \t ", " ".join(varied_texts(40, seed=9, max_words=40)), "a"]
    expected = model.encode(texts, batch_size=1)
    got = served.embed(texts, model=f"static_{layout}")
    assert got.shape == expected.shape == (len(texts), 64)
    assert np.abs(got - expected).max() <= MAX_ABS, float(np.abs(got - expected).max())
    assert not expected[len(TEXTS)].any() and not got[len(TEXTS)].any()
    assert np.allclose(np.delete(np.linalg.norm(got, axis=1), len(TEXTS)), 1, atol=1e-5) == (layout != "retrieval")
    only_space = served.embed(["  \t "], model=f"static_{layout}")  # a request of it alone
    assert only_space.shape == (1, 64) and not only_space.any()
    # Not trivially so: with the [CLS] and [SEP] its tokenizer.json's post-processor adds, the means differ.
    module = folder / ("0_StaticEmbedding" if layout == "retrieval" else "")
    tokenizer = Tokenizer.from_file(str(module / "tokenizer.json"))
    table = model[0].embedding.weight.detach().numpy()
    assert len(tokenizer.encode(texts[-2], add_special_tokens=False).ids) > 500
    with_specials = np.stack([table[tokenizer.encode(text).ids].mean(0) for text in texts[:3]])
    if layout != "retrieval":
        with_specials = normalize(with_specials)
    assert np.abs(with_specials - got[:3]).max() > 1e-3


def test_a_splade_model_is_served_as_sentence_transformers_sparse_encoder_encodes(served, modern_root: Path) -> None:
    """A vocabulary-wide vector per text, log1p(relu(MLM logits)) pooled by max (ONNX server) or sum
    (TorchScript server), equal to the library's within 1e-5 of each text's largest weight (a sum of
    ~30 tokens' weights carries fp32 noise in proportion)."""
    from sentence_transformers import SparseEncoder

    folder = build_sparse(modern_root, "bert", SPLADE[served.runtime])
    encoder = SparseEncoder(str(folder), device="cpu")
    expected = encoder.encode(TEXTS, batch_size=1, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
    got = served.embed(TEXTS, model="splade")
    vocabulary = encoder.tokenizer.vocab_size
    assert got.shape == expected.shape == (len(TEXTS), vocabulary)
    for index, (g, e) in enumerate(zip(got, expected)):
        assert np.abs(g - e).max() <= MAX_ABS * (1 + np.abs(e).max()), (index, float(np.abs(g - e).max()))
    # Not trivially so: each text weighs much of the (tiny, random) vocabulary and leaves some at zero.
    assert ((expected > 0).sum(axis=1) > 5).all() and (expected == 0).any(axis=1).all()
    # text-embeddings-inference's /embed_sparse through the gateway: the same weights, the non-zero ones by index.
    import httpx

    from conftest import running_gateway

    with running_gateway(served.served_by.grpc_url, admin_key=served.served_by.admin_key) as base:
        sparse = httpx.post(f"{base}/embed_sparse", json={"model": "splade", "inputs": TEXTS[:4]}, timeout=60)
        dense = httpx.post(f"{base}/embed_sparse", json={"model": "roberta_embed", "inputs": TEXTS[:1]}, timeout=60)
    assert sparse.status_code == 200, sparse.text
    for entries, e in zip(sparse.json(), expected[:4]):
        indices = [entry["index"] for entry in entries]
        assert indices == sorted(indices) and all(entry["value"] != 0 for entry in entries)
        whole = np.zeros_like(e)
        whole[indices] = [entry["value"] for entry in entries]
        assert np.abs(whole - e).max() <= MAX_ABS * (1 + np.abs(e).max())
    assert dense.status_code == 424 and "SPLADE pooling" in dense.json()["error"]


def test_prompts_are_applied_as_sentence_transformers_applies_them(served, modern_root: Path) -> None:
    """The model's default prompt when a request names none, the named one otherwise (client and
    gateway), an unknown name refused with the names; usage counts the prompt's tokens."""
    import httpx
    from sentence_transformers import SentenceTransformer

    from conftest import running_gateway

    only_on(served, "torchscript")
    st = SentenceTransformer(str(build_st(modern_root, "bert", "mean", prompts=True)), device="cpu")
    texts = TEXTS[:6]
    default, passage = st.encode(texts), st.encode(texts, prompt_name="passage")
    assert np.abs(default - passage).max() > 1e-3  # the prompts really change the vectors
    assert np.abs(served.embed(texts, model="st_prompts") - default).max() <= MAX_ABS
    assert np.abs(served.embed(texts, model="st_prompts", prompt_name="passage") - passage).max() <= MAX_ABS
    with running_gateway(served.served_by.grpc_url, admin_key=served.served_by.admin_key) as base:
        answer = httpx.post(f"{base}/v1/embeddings", json={"model": "st_prompts", "input": texts,
                                                            "prompt_name": "passage"}, timeout=60)
        unknown = httpx.post(f"{base}/v1/embeddings", json={"model": "st_prompts", "input": texts,
                                                             "prompt_name": "nope"}, timeout=60)
    assert answer.status_code == 200, answer.text
    vectors = np.array([row["embedding"] for row in answer.json()["data"]])
    assert np.abs(vectors - passage).max() <= MAX_ABS
    counted = sum(len(st.tokenizer("document: " + t)["input_ids"]) for t in texts)
    assert answer.json()["usage"]["prompt_tokens"] == counted
    assert unknown.status_code == 400 and "passage, query" in unknown.json()["error"]["message"]


@pytest.mark.parametrize(("name", "family", "tokens"), RERANKERS, ids=[case[0] for case in RERANKERS])
def test_a_decoder_reranker_scores_through_rerank(served, modern_root: Path, name: str, family: str,
                                                  tokens: tuple[str, ...]) -> None:
    """A causal LM exported with --classifier-from-tokens and a prompt template answers /v1/rerank with what
    transformers' full LM head gives at the last token: the probability of "yes" against "no" (no,yes:
    Qwen3-Reranker), or the sigmoid of the "yes" logit alone (yes: bge-reranker-v2-gemma's "Yes")."""
    import httpx
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import running_gateway

    only_on(served, "torchscript")
    folder = build(modern_root, family, "causal")
    query, documents = "a man eats food", ["the dog runs quickly over the bridge", "a man eats bread", "night"]
    with running_gateway(served.served_by.grpc_url, admin_key=served.served_by.admin_key) as base:
        response = httpx.post(f"{base}/v1/rerank", json={"model": name, "query": query,
                                                          "documents": documents}, timeout=60)
        # vLLM's max_tokens_per_doc: each document cut to its first 2 tokens before the template is filled.
        cut = httpx.post(f"{base}/v1/rerank", json={"model": name, "query": query, "documents": documents,
                                                     "max_tokens_per_doc": 2}, timeout=60)
    assert response.status_code == 200, response.text
    assert cut.status_code == 200, cut.text
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer.convert_tokens_to_ids(list(tokens))

    def expected(document: str) -> float:
        text = RERANK_TEMPLATE.replace("{query}", query).replace("{document}", document)
        with torch.no_grad():
            last = model(**tokenizer(text, return_tensors="pt")).logits[0, -1].numpy()
        logit = last[ids[1]] - last[ids[0]] if len(ids) == 2 else last[ids[0]]
        return float(1 / (1 + np.exp(-logit)))

    got = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    for index, document in enumerate(documents):
        assert abs(got[index] - expected(document)) <= MAX_ABS, (index, got[index], expected(document))
    assert np.ptp(list(got.values())) > 1e-3  # the documents really score differently
    got_cut = {r["index"]: r["relevance_score"] for r in cut.json()["results"]}
    for index, document in enumerate(documents):  # the text up to where its 2nd token ends (transformers' offsets)
        offsets = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        short = document[: offsets[1][1]] if len(offsets) > 2 else document
        assert abs(got_cut[index] - expected(short)) <= MAX_ABS, (index, short, got_cut[index], expected(short))
    assert abs(got_cut[0] - got[0]) > 1e-3  # the first document really was cut


# Classifiers read with pairs: bart-large-mnli's (premise, hypothesis), three </s> in each and the head
# reading the last; gte-multilingual-reranker-base's (query, document) in XLM-R's template; a NomicBERT's
# with BERT's segment ids.
PAIR_CLASSIFIERS = ("bart", "gte", "nomic_bert")


@pytest.mark.parametrize("family", PAIR_CLASSIFIERS)
def test_a_classifier_classifies_pairs_as_transformers_does(served, modern_root: Path, family: str) -> None:
    """The served probabilities of (text, text) pairs are transformers' on each pair alone."""
    from transformers import AutoTokenizer

    folder = build(modern_root, family, "classify")
    premises = TEXTS[:6]
    hypotheses = [f"this text is about {word}" for word in ("food", "a dog", "night", "music", "one", "bread")]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = np.stack([softmax(model(**tokenizer(p, h, return_tensors="pt")).logits[0].numpy())
                             for p, h in zip(premises, hypotheses)])
    if family == "bart":
        assert all(tokenizer(p, h)["input_ids"].count(tokenizer.eos_token_id) == 3
                   for p, h in zip(premises, hypotheses))
    if family == "nomic_bert":  # the second text's segment is really read
        assert max(tokenizer(premises[0], hypotheses[0])["token_type_ids"]) == 1
    got = served.classify(premises, model=name_of(family, "classify"), pairs=hypotheses).probabilities
    assert got.shape == expected.shape and np.abs(got - expected).max() <= MAX_ABS, float(np.abs(got - expected).max())
    alone = served.classify(premises, model=name_of(family, "classify")).probabilities
    assert np.abs(alone - expected).max() > 1e-3  # the second texts really change the answers
    # text-embeddings-inference's /predict through the gateway: pairs and a single text in one batch.
    import httpx

    from conftest import running_gateway

    with running_gateway(served.served_by.grpc_url, admin_key=served.served_by.admin_key) as base:
        predicted = httpx.post(f"{base}/predict", json={"model": name_of(family, "classify"), "inputs": [
            *([p, h] for p, h in zip(premises, hypotheses)), [premises[0]]]}, timeout=60)
    assert predicted.status_code == 200, predicted.text
    labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    scores = np.array([[{a["label"]: a["score"] for a in answer}[label] for label in labels]
                       for answer in predicted.json()])
    assert all([a["score"] for a in answer] == sorted((a["score"] for a in answer), reverse=True)
               for answer in predicted.json())
    assert np.abs(scores - np.vstack([expected, alone[:1]])).max() <= MAX_ABS


def _alibaba_ids(folder: Path, texts: list[str], pairs: list[str] | None = None) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    return [tokenizer.encode(*texts_).ids for texts_ in zip(texts, pairs or [None] * len(texts))]


def test_alibabas_own_gte_loads_as_transformers_gte_computing_as_their_code(modern_root: Path) -> None:
    """A `new` config read as transformers' gte (export.view), against their model's math written from their
    code (tests/alibaba_gte.py): the packed projections, the gate's half, the fixed NTK rope, the pooler."""
    from pooltriton.export.view import transformers_view

    for head, loader in (("embed", AutoModel), ("classify", AutoModelForSequenceClassification)):
        folder = build_alibaba_gte(modern_root, head)
        resolved = resolve(folder)  # `pooltriton inspect`: the config files alone, read the same way
        assert (resolved.model_type, resolved.pooling_type.value) == ("gte", "CLS")
        with transformers_view(folder) as view:
            assert view != folder and json_of(folder)["model_type"] == "new" and json_of(view)["model_type"] == "gte"
            model = loader.from_pretrained(view).eval()
        assert not view.exists()
        for ids in _alibaba_ids(folder, TEXTS[:6]):
            with torch.no_grad():
                output = model(input_ids=torch.tensor([ids]))
            if head == "embed":
                expected = alibaba_gte(folder, ids)
                assert (output.last_hidden_state[0].double() - expected).abs().max() <= 1e-4 * expected.abs().max()
                assert (alibaba_gte(folder, ids, ntk=False) - expected).abs().max() > 0.1  # the NTK rope matters
            else:
                expected = alibaba_gte_logits(folder, ids)
                assert (output.logits[0].double() - expected).abs().max() <= 1e-4 * (1 + expected.abs().max())


def json_of(folder: Path) -> dict:
    import json

    return json.loads((folder / "config.json").read_text())


def test_alibabas_own_gte_is_served_as_their_code_computes(served, modern_root: Path) -> None:
    """gte-base-en-v1.5's kind through its sentence-transformers files (CLS, Normalize); the reranker's kind
    on (query, document) pairs, its one label through a sigmoid; both against their code's math."""
    folder = build_alibaba_gte(modern_root, "embed")
    expected = normalize(np.stack([alibaba_gte(folder, ids)[0].numpy() for ids in _alibaba_ids(folder, TEXTS)]))
    got = served.embed(TEXTS, model="alibaba_gte_embed")
    assert got.shape == expected.shape and np.abs(got - expected).max() <= MAX_ABS, float(np.abs(got - expected).max())
    folder = build_alibaba_gte(modern_root, "classify")
    queries = TEXTS[:6]
    documents = [f"this text is about {word}" for word in ("food", "a dog", "night", "music", "one", "bread")]
    logits = np.stack([alibaba_gte_logits(folder, ids).numpy() for ids in _alibaba_ids(folder, queries, documents)])
    got = served.classify(queries, model="alibaba_gte_classify", pairs=documents).probabilities
    expected = 1 / (1 + np.exp(-logits))
    assert got.shape == expected.shape and np.abs(got - expected).max() <= MAX_ABS, float(np.abs(got - expected).max())
    assert np.abs(expected - 0.5).max() > 0.1  # not a flat sigmoid


def test_the_texts_are_longer_than_every_window(modern_root: Path) -> None:
    """Otherwise a lost window could not show."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build(modern_root, "mistral", "embed"))
    assert sum(len(tokenizer(t)["input_ids"]) > 3 * WINDOW for t in TEXTS) >= 4


def test_a_lost_window_fails_verification(modern_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The export's check compares with transformers, not with its own wrapper: a wrapper that drops the
    sliding window (what the export did before) is refused, and the one that keeps it passes."""
    from pooltriton.cli import main
    from pooltriton.core import resolve as resolve_module

    model = str(build(modern_root, "gemma3", "embed"))
    monkeypatch.setattr(resolve_module, "sliding_window", lambda hf: 0)
    assert main(["export", model, "--name", "g", "--out", str(tmp_path), "--runtime", "torchscript"]) == 1
    assert "differs from transformers (AutoModel)" in capsys.readouterr().err and not list(tmp_path.iterdir())
    monkeypatch.undo()
    assert main(["export", model, "--name", "g", "--out", str(tmp_path), "--runtime", "torchscript"]) == 0


@pytest.mark.parametrize(("make", "message"), [
    ("unsupported", "is not a supported architecture"),
    ("no_tokenizer", "has no tokenizer.json"),
    ("corrupt_weights", "cannot be loaded"),
    ("remote_code", "--trust-remote-code"),
    # vLLM's GritLM (bidirectional, MEAN after the instruction) under Mistral's model_type, without its code
    ("foreign_architecture", "names the architecture GritLM, which is neither a transformers class"),
    # transformers' Qwen3 attends causally whatever this says; TEI and vLLM's Voyage model both ways
    ("bidirectional_flag", 'set "is_causal": false in config.json too'),
])
def test_refusals_are_one_paragraph_with_exit_2(modern_root: Path, tmp_path: Path, make: str, message: str) -> None:
    import json
    import shutil

    folder = tmp_path / "model"
    family = {"foreign_architecture": "mistral", "bidirectional_flag": "qwen3"}.get(make, "roberta")
    shutil.copytree(build(modern_root, family, "embed"), folder)
    config = json.loads((folder / "config.json").read_text())
    if make == "unsupported":
        config.update(model_type="falcon", architectures=["FalconModel"])
    elif make == "remote_code":
        config["auto_map"] = {"AutoModel": "modeling_x.XModel"}
    elif make == "foreign_architecture":
        config["architectures"] = ["GritLM"]
    elif make == "bidirectional_flag":
        config["use_bidirectional_attention"] = True
    (folder / "config.json").write_text(json.dumps(config))
    if make == "no_tokenizer":
        (folder / "tokenizer.json").unlink()
    if make == "corrupt_weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = subprocess.run([sys.executable, "-m", "pooltriton.cli", "export", str(folder), "--name", "x",
                             "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("pooltriton export:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr[-2000:]
