"""Unit tests of the pieces that need no server: resolution, config rendering, ragged batching."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pooltriton.backends.ragged import MemoryModel, RaggedStats, plan_chunks, run_ragged, sequentially
from pooltriton.client.service import Overloaded, RequestError, WrongTask
from pooltriton.contract.config import DynamicBatching, ModelConfig, Tensor, repository_models
from pooltriton.contract.parameters import (
    STAGE_PARAMETERS,
    EncoderParameters,
    EnsembleParameters,
    ImageParameters,
    PluginParameters,
    PoolerParameters,
    ScorerParameters,
    TokenizerParameters,
)
from pooltriton.core.resolve import resolve
from pooltriton.core.semantics import Activation, PoolingType, Task, Truncation
from pooltriton.core.tokenization import InputError, TextTokenizer, cut_text, cut_within
from pooltriton.export.defaults import minilm_path


def test_minilm_resolves_from_sentence_transformers_metadata() -> None:
    config = resolve(minilm_path())
    assert config.task is Task.EMBED
    assert config.pooling_type is PoolingType.MEAN
    assert config.activation is Activation.NORMALIZE and config.use_activation
    assert config.max_length == 256  # sentence_bert_config.json, not tokenizer.json's 128
    assert config.sources["pooling_type"] == "sentence-transformers"


def test_explicit_beats_sentence_transformers() -> None:
    config = resolve(minilm_path(), pooling_type="CLS", use_activation=False, max_length=128)
    assert config.pooling_type is PoolingType.CLS and not config.use_activation and config.max_length == 128
    assert {config.sources[k] for k in ("pooling_type", "use_activation", "max_length")} == {"explicit"}


def test_task_the_model_cannot_serve_is_an_error() -> None:
    with pytest.raises(ValueError, match="no classification head"):
        resolve(minilm_path(), task="classify")


def test_inspect_cli_prints_resolved_config() -> None:
    out = subprocess.run([sys.executable, "-m", "pooltriton.cli", "inspect", str(minilm_path())],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out)["pooling_type"] == "MEAN"


def test_config_rendering(tmp_path: Path) -> None:
    """Written by protobuf's text_format and read back by it into Triton's own message."""
    from pooltriton.contract.config import QueuePolicy, parse_config

    folder = ModelConfig(
        name="m", backend="onnxruntime", max_batch_size=8,
        inputs=[Tensor("input_ids", "TYPE_INT64", (-1,), allow_ragged_batch=True)],
        outputs=[Tensor("pooled", "TYPE_FP32", (384,))],
        dynamic_batching=DynamicBatching(100, priority_levels=3, queue=QueuePolicy(4, 5000)), parameters={"k": 2},
    ).write(tmp_path)
    config = parse_config(folder / "config.pbtxt")
    assert config.backend == "onnxruntime" and config.input[0].allow_ragged_batch
    assert list(config.output[0].dims) == [384] and config.instance_group[0].count == 1
    batching = config.dynamic_batching
    assert batching.max_queue_delay_microseconds == 100 and config.parameters["k"].string_value == "2"
    assert (batching.priority_levels, batching.default_priority_level) == (3, 2)
    assert (batching.default_queue_policy.max_queue_size, batching.default_queue_policy.default_timeout_microseconds,
            batching.default_queue_policy.allow_timeout_override) == (4, 5000, True)
    # A stage's batcher: short requests (PRIORITY_SHORT) above the default level, which is not the middle.
    from pooltriton.contract import DEFAULT_PRIORITY_LEVEL, PRIORITY_LEVELS, PRIORITY_SHORT
    from pooltriton.contract.config import stage_batching

    staged = ModelConfig(name="s", backend="tokenizer", max_batch_size=8, inputs=[], outputs=[],
                         dynamic_batching=stage_batching(QueuePolicy(4, 5000))).write(tmp_path)
    batching = parse_config(staged / "config.pbtxt").dynamic_batching
    assert (batching.priority_levels, batching.default_priority_level, batching.max_queue_delay_microseconds) == (
        PRIORITY_LEVELS, DEFAULT_PRIORITY_LEVEL, 0)
    assert 1 < PRIORITY_SHORT < DEFAULT_PRIORITY_LEVEL < PRIORITY_LEVELS


@pytest.mark.parametrize(("value", "expected"), [(None, "NONE"), (True, "END"), ("start", "START"),
                                                 ("false", "NONE"), ("END", "END")])
def test_truncation_parse(value, expected) -> None:
    assert Truncation.parse(value).value == expected


def test_truncation_parse_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="invalid truncate value"):
        Truncation.parse("middle")


def test_tokenizer_ignores_tokenizer_json_limits() -> None:
    tokenizer = TextTokenizer(str(minilm_path() / "tokenizer.json"), max_length=256)
    batch = tokenizer(["word " * 200, "short"])
    assert batch.input_ids.shape == (2, 202) and list(batch.lengths) == [202, 3]
    with pytest.raises(InputError, match="limit of 256"):
        tokenizer(["word " * 300])


def test_a_text_cut_to_its_first_or_last_tokens_reads_as_the_reference_tokenizer_cuts_it() -> None:
    """vLLM's max_tokens_per_doc cuts the text where its Nth token ends: read again, the first N tokens are
    transformers' own truncation of the text (MiniLM's WordPiece, words split into pieces included); the last
    N are the text from the end of token len - N (the scorer reads a cut text again: a word's pieces alone can
    read as more); a character split over two tokens is never cut in half; 0 or a short text stays."""
    from transformers import AutoTokenizer

    ours = TextTokenizer(str(minilm_path() / "tokenizer.json"), max_length=256)
    reference = AutoTokenizer.from_pretrained(str(minilm_path()))
    text = "Tokenization splits unbelievably long words, e.g. antidisestablishmentarianism, into pieces."
    spans = ours.encoding(text, add_special_tokens=False).offsets
    for limit in range(1, len(spans)):
        cut = cut_text(text, spans, limit)
        assert ours.ids(cut) == reference(text, truncation=True, max_length=limit + 2)["input_ids"], limit
        assert cut_text(text, spans, limit, keep_start=False) == text[spans[-limit - 1][1] :], limit
    # No space for many tokens (CJK, a URL): still the last `limit` tokens, not the text after the next space.
    for other in ("漢字仮名交じり文と中文字符" * 8 + " ok", "see https://example.com/a-very/long_path?q=1 now"):
        other_spans = ours.encoding(other, add_special_tokens=False).offsets
        tail = cut_text(other, other_spans, 10, keep_start=False)
        assert other.endswith(tail) and len(ours.ids(tail, add_special_tokens=False)) == 10, tail
    assert cut_text(text, spans, 0) == text == cut_text(text, spans, len(spans))
    assert cut_text("ab\U0001F600c", [(0, 1), (1, 2), (2, 3), (2, 3), (3, 4)], 3) == "ab"
    assert cut_text("ab\U0001F600c", [(0, 1), (1, 2), (2, 3), (2, 3), (3, 4)], 2, keep_start=False) == "c"
    assert cut_text("\U0001F600c", [(0, 1), (0, 1), (1, 2)], 1) == ""  # the scorer refuses it by name
    assert cut_text("a b", [None, (0, 1), (2, 3), None], 1) == "a"  # special tokens are not the text's


@pytest.mark.parametrize("family", ["minilm", "qwen3", "xlmr", "roberta"])
def test_cut_texts_read_again_within_their_limit(family: str, tmp_path: Path) -> None:
    """The scorer's cut (cut_within over the model's tokenizer): for WordPiece, byte-level BPE (Qwen, RoBERTa)
    and Unigram (XLM-R), on texts of accents, CJK and emoji, from either end, every text is within its limit
    read again, ends (or starts) as the text does, and keeps all of it that fits: never fewer than limit - 2
    tokens (a word cut in two reads as its own pieces)."""
    import random

    from tiny_models import build

    folder = minilm_path() if family == "minilm" else build(tmp_path, family, "embed")
    tokenizer = TextTokenizer(str(folder / "tokenizer.json"), max_length=512)

    def read(texts: list[str]) -> list:
        return [tokenizer.encoding(text, add_special_tokens=False).offsets for text in texts]

    rng = random.Random(0)
    alphabet = [*"abcdefghij klmnop qrstu vwxyz ,.-", "é", "漢", "字", "\U0001F600", "ß", " "]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(5, 80))).strip() or "a" for _ in range(150)]
    for keep_start in (True, False):
        for limit in (1, 3, 12):
            cut = cut_within(texts, limit, keep_start, read)
            for text, short in zip(texts, cut, strict=True):
                tokens = len(tokenizer.ids(short, add_special_tokens=False))
                assert (text.startswith(short) if keep_start else text.endswith(short)), (text, short)
                whole = len(tokenizer.ids(text, add_special_tokens=False))
                assert min(whole, max(limit - 2, 1)) <= tokens <= limit, (text, short, tokens)
    with pytest.raises(InputError, match="leaves nothing of text 1"):
        cut_within(["ok", "\U0001F600c"], 1, True, lambda texts: [[(0, 1), (1, 2)], [(0, 1), (0, 1), (1, 2)]])


@pytest.mark.parametrize(("names", "problem"), [(("name",), "not the model's own"), (("a", "a"), "each name once"),
                                               (("../x",), "invalid model name"),
                                               (("name_score",), "not the model's own")])
def test_served_model_names_are_checked_at_export(names: tuple[str, ...], problem: str) -> None:
    from pooltriton.core.capabilities import detect
    from pooltriton.core.resolve import ResolutionError
    from pooltriton.export.build import ExportOptions

    with pytest.raises(ResolutionError, match=problem):
        ExportOptions(name="name", out=Path("unused"), served_model_names=names).check(detect())
    assert ExportOptions(name="name", out=Path("unused"), served_model_names=("other", "emb-3")).check(detect())


def test_a_request_of_no_texts_fails_alone() -> None:
    """Triton's front end refuses a TEXT of no elements; a BLS caller's still gets its own error, and
    the requests batched with it are encoded."""
    tokenizer = TextTokenizer(str(minilm_path() / "tokenizer.json"), max_length=256)
    empty, fine = tokenizer.encode_requests([([], None, Truncation.parse(None), 256),
                                             (["short"], None, Truncation.parse(None), 256)])
    assert isinstance(empty, InputError) and "empty batch" in str(empty)
    assert [e.ids for e in fine[0]] == [e.ids for e in tokenizer.encode_requests(
        [(["short"], None, Truncation.parse(None), 256)])[0][0]]


def test_plan_chunks_sorts_and_respects_budget() -> None:
    lengths = np.array([5, 300, 20, 7, 300, 64, 700])
    chunks = plan_chunks(lengths, token_budget=600, max_rows=4, call_cost=64)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(7))
    # 700 alone (over budget), the two 300s, 64 alone (too far from 20), the short ones together.
    assert [sorted(c.tolist()) for c in chunks] == [[6], [1, 4], [5], [0, 2, 3]]
    for chunk in chunks:
        assert len(chunk) * lengths[chunk].max() <= 600 or len(chunk) == 1


def test_plan_chunks_of_one_row_is_that_row_whatever_its_length() -> None:
    memory = MemoryModel(token_bytes=12288, cell_bytes=80, budget=1 << 20)
    for length in (1, 30, 5000):  # 5,000 tokens: over both budgets, the caller's to refuse
        chunks = plan_chunks(np.array([length]), token_budget=600, memory=memory)
        assert [c.tolist() for c in chunks] == [[0]] and chunks[0].dtype == np.argsort(np.array([length])).dtype


def test_plan_chunks_bounds_attention_memory_by_the_square_of_the_width() -> None:
    # 4 heads x 4 copies + 2 masks, 4 bytes: 80 bytes per query-key cell, 12 KB per token of a row.
    memory = MemoryModel(token_bytes=12288, cell_bytes=80, budget=6 << 30)
    lengths = np.array([8192, 8192, 4096, 4096, 4096, 100, 100])
    # The token budget alone would put the two 4096s and the 100s together; the memory may not.
    chunks = plan_chunks(lengths, token_budget=1 << 20, max_rows=64, call_cost=64, memory=memory)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(7))
    for chunk in chunks:
        assert len(chunk) == 1 or len(chunk) * memory.row_bytes(int(lengths[chunk].max())) <= memory.budget
    assert [len(c) for c in chunks] == [1, 1, 3, 2]  # 8192 alone (each 5.5 GB), three 4096s (4.2 GB), the 100s
    # The longest row that fits alone, exactly at the edge.
    longest = memory.longest()
    assert memory.row_bytes(longest) <= memory.budget < memory.row_bytes(longest + 1)
    assert 8192 < longest < 9000


def test_plan_chunks_trades_padding_against_calls() -> None:
    lengths = np.random.default_rng(0).integers(5, 170, size=128)
    chunks = plan_chunks(lengths, token_budget=2048, max_rows=64, call_cost=64)
    padded = sum(len(c) * lengths[c].max() for c in chunks)
    assert padded <= 1.06 * lengths.sum()  # few padded positions ...
    assert len(chunks) <= 16  # ... without one call per length
    # No single row is its own chunk with a cheaper neighbour merge left undone: the plan is optimal
    # against the greedy "one chunk per budget" and "one chunk per row" plans.
    greedy = plan_chunks(lengths, token_budget=2048, max_rows=64, call_cost=10**9)
    per_row = plan_chunks(lengths, token_budget=2048, max_rows=1, call_cost=64)
    def cost(plan):
        return sum(len(c) * lengths[c].max() + 64 for c in plan)
    assert cost(chunks) <= min(cost(greedy), cost(per_row))


def test_run_ragged_equals_one_by_one() -> None:
    """Merging requests of different widths must not change any row's answer."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(50, 4)).astype(np.float32)

    def encoder(feeds):  # masked mean of embedded ids, per token output too
        emb = weights[feeds["input_ids"]] * feeds["attention_mask"][..., None]
        pooled = emb.sum(1) / feeds["attention_mask"].sum(1, keepdims=True)
        return {"pooled": pooled, "tokens": emb}

    requests = []
    for n, width in [(1, 3), (3, 9), (2, 5)]:
        ids = rng.integers(1, 50, size=(n, width))
        mask = np.ones_like(ids)
        mask[0, width - 1 :] = 0 if width > 1 else 1
        ids[mask == 0] = 0
        requests.append({"input_ids": ids, "attention_mask": mask})
    stats = RaggedStats()
    merged = run_ragged(requests, sequentially(encoder), {"tokens"}, {"input_ids": 0}, stats)
    for request, out in zip(requests, merged):
        alone = encoder(request)
        np.testing.assert_allclose(out["pooled"], alone["pooled"], rtol=1e-6)
        assert out["tokens"].shape == alone["tokens"].shape
        np.testing.assert_allclose(out["tokens"], alone["tokens"], rtol=1e-6)
    assert stats.real_tokens == sum(int(r["attention_mask"].sum()) for r in requests)
    assert stats.computed_tokens >= stats.real_tokens
    # One-row chunks padded to a multiple of 4 (OpenVINO's shape reuse): same answers, padding counted.
    rounded_stats = RaggedStats()
    rounded = run_ragged(requests[:1], sequentially(encoder), {"tokens"}, {"input_ids": 0}, rounded_stats,
                         single_row_multiple=4, max_width=16)
    np.testing.assert_allclose(rounded[0]["pooled"], merged[0]["pooled"], rtol=1e-6)
    assert rounded[0]["tokens"].shape == merged[0]["tokens"].shape
    assert rounded_stats.computed_tokens == 4 and rounded_stats.real_tokens == 2  # 2 real -> width 4


def test_run_ragged_keeps_each_texts_own_row_input() -> None:
    """ACTIVATE ([n, 1], one value per text) travels with its text through chunks planned by length,
    unpadded, so requests that ask for raw and for normalised vectors share one batch."""
    seen = []

    def encoder(feeds):
        seen.append(feeds["activate"].shape)
        assert feeds["activate"].shape == (len(feeds["input_ids"]), 1)
        widths = feeds["attention_mask"].sum(1, keepdims=True).astype(np.float32)
        return {"pooled": np.where(feeds["activate"] > 0, -widths, widths)}

    ones = np.ones
    requests = [{"input_ids": ones((n, width), np.int64), "attention_mask": ones((n, width), np.int64),
                 "activate": np.full((n, 1), flag, dtype=np.int64)}
                for n, width, flag in [(2, 3, 1), (1, 40, 0), (3, 7, 0), (1, 2, 1)]]
    merged = run_ragged(requests, sequentially(encoder), set(), {"input_ids": 0}, token_budget=64,
                        row_inputs=frozenset({"activate"}))
    for request, out in zip(requests, merged):
        sign = -1 if request["activate"][0, 0] else 1
        np.testing.assert_array_equal(out["pooled"], sign * request["attention_mask"].sum(1, keepdims=True))
    assert len(seen) > 1  # the rows really were split into several chunks


# Each layer (a folder of src/pooltriton) and the layers it may import (docs/architecture.md).
LAYERS = {
    "core": {"core"},
    "contract": {"core", "contract"},
    "export": {"core", "contract", "export"},
    "backends": {"core", "contract", "backends"},
    "server": {"core", "contract", "server"},
    "client": {"core", "contract", "client"},
    "gateway": {"core", "contract", "client", "gateway"},
    "examples": {"core", "contract", "examples"},
}


def test_layers_import_downward_only() -> None:
    import ast

    import pooltriton

    package = Path(pooltriton.__file__).parent
    assert {p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS)
    wrong = []
    for layer, allowed in LAYERS.items():
        for path in (package / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "pooltriton" and (len(parts) < 2 or parts[1] not in allowed):
                        wrong.append(f"{path.relative_to(package)} imports {name}")
    assert not wrong, wrong


def test_model_facts_are_resolved_once(tmp_path) -> None:
    """The resolver decides decoder or encoder and head kind; the encoder wrapper only reads them."""
    for model_type, architecture, causal, pooling in [
        ("qwen3", "Qwen3Model", True, PoolingType.LAST), ("gemma3", "Gemma3Model", True, PoolingType.LAST),
        ("bert", "BertModel", False, PoolingType.CLS), ("bert", "BertLMHeadModel", True, PoolingType.LAST),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture]}))
        config = resolve(tmp_path)
        assert (config.causal, config.pooling_type) == (causal, pooling), model_type
        assert config.to_json()["causal"] == causal
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "num_labels": 2,
                                                      "architectures": ["BertForSequenceClassification"]}))
    assert resolve(tmp_path).self_pooling_head


def test_the_encoder_wrapper_obeys_the_resolved_causal_flag(tmp_path) -> None:
    """The wrapper takes causality from the resolved config, not from a list of families of its own:
    the same BERT weights wrapped as causal attend only backwards (the first token cannot see the
    rest, so changing a later token leaves it alone), and bidirectionally otherwise."""
    import dataclasses

    import torch
    from tiny_models import build

    from pooltriton.export.encoder import load_encoder

    folder = build(tmp_path, "bert", "embed")
    config = dataclasses.replace(resolve(folder, pooling_type="CLS"), causal=False)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9]])
    mask = torch.ones_like(ids)
    outputs = {}
    for causal in (False, True):
        encoder = load_encoder(folder, dataclasses.replace(config, causal=causal))
        assert encoder.causal is causal
        with torch.no_grad():
            extra = {"token_type_ids": torch.zeros_like(ids), "activate": torch.zeros(len(ids), 1, dtype=torch.int64)}
            outputs[causal] = encoder(ids, mask, *(extra[name] for name in encoder.input_names[2:]))
    assert torch.allclose(outputs[True][0], outputs[True][1])  # CLS of a causal model: token 0 sees only itself
    assert not torch.allclose(outputs[False][0], outputs[False][1])


def test_queue_size_is_what_the_capacity_clears_within_the_timeout() -> None:
    from pooltriton.export.sizing import queue_size_for

    assert queue_size_for(1.4, 30_000) == 42  # 32-text requests on 2 cores (docs/performance.md)
    assert queue_size_for(150, 30_000) == 4500
    assert queue_size_for(0.01, 1000) == 1
    with pytest.raises(ValueError):
        queue_size_for(0, 30_000)


STAGE_EXAMPLES = [
    TokenizerParameters(max_length=256, pad_token_id=0, outputs=("input_ids", "attention_mask"),
                        tokenizer_file="tok.json", pad_to_buckets=(16, 32, 256), prompts={"query": "query: "},
                        default_prompt_name="query"),
    TokenizerParameters(max_length=8, pad_token_id=1, outputs=("input_ids",)),
    EncoderParameters(pad_token_id=0, max_length=8192, ragged_token_budget=2048, memory_per_token=12288,
                      memory_per_attention_cell=72, memory_budget=1 << 30),
    EncoderParameters(pad_token_id=3, max_length=128),
    PoolerParameters(task="classify", activation="softmax", use_activation=False, step_tag_id=12),
    PoolerParameters(task="embed", activation="normalize"),
    ScorerParameters(mode="cross_encoder", model="m", output="PROBABILITIES",
                     template='query: {query} "document": {document}\n'),
    PluginParameters(plugin="zero_shot", model="m", outputs=("PROBABILITIES",), module="my.plugins"),
    EnsembleParameters(task="classify", max_length=512, labels=("1", "true", "B-PER"), matryoshka_dimensions=(64,)),
    EnsembleParameters(task="embed", max_length=512),
    EnsembleParameters(task="embed", modality="image", text_model="clip"),
    ImageParameters(processor_file="preprocessor_config.json", max_image_bytes=1 << 20, use_activation=False),
]


@pytest.mark.parametrize("parameters", STAGE_EXAMPLES, ids=lambda p: type(p).__name__)
def test_stage_parameters_round_trip_through_triton_s_own_config_parser(parameters, tmp_path: Path) -> None:
    """Written into config.pbtxt by the export's path, parsed back by Triton's protobuf, read as the stage
    reads it: equal, with every value its declared type (a label "1" stays a string, false stays false)."""
    from pooltriton.contract.config import parse_config

    folder = ModelConfig(name="stage", inputs=[], outputs=[], backend="python",
                         parameters=parameters.to_parameters()).write(tmp_path)
    parsed = parse_config(folder / "config.pbtxt")
    back = type(parameters).from_parameters({k: v.string_value for k, v in parsed.parameters.items()})
    assert back == parameters
    assert STAGE_PARAMETERS  # every stage's class is exercised above
    assert {type(p) for p in STAGE_EXAMPLES} == set(STAGE_PARAMETERS)


def test_the_server_loads_the_repository_s_models_and_no_other_folder(tmp_path: Path) -> None:
    from pooltriton.server.launcher import TritonServer

    for name in ("b", "a", ".pooltriton-export-incoming~1.x", "lost+found"):
        (tmp_path / name).mkdir()
    for name in ("a", "b", ".pooltriton-export-incoming~1.x"):
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"')
    assert repository_models(tmp_path) == ["a", "b"]
    command = TritonServer(tmp_path, tmp_path).command()
    assert [arg for arg in command if arg.startswith("--load-model")] == ["--load-model=a", "--load-model=b"]


def test_a_retired_stub_killed_now_is_not_taken_for_its_instance_s_death(monkeypatch) -> None:
    """A stub of a leaked model bears the same instance name as its replacement: when its grace ends
    and it is killed, the watch must not read the scan's old pid as the live instance's and reload a
    healthy model (it did, once in a CI run: the tokenizer reloaded in the scorer's fault test)."""
    import pooltriton.server.supervisor as supervisor_module

    class Server:
        shm_prefix = "pooltriton-test"

        def unload(self, model: str) -> None:
            reloads.append(model)

        load = unload

    reloads: list[str] = []
    live, leaked = 100, 200
    # The killed stub is still listed by the next scan too (not yet reaped), then gone.
    both = {live: "m_tokenizer_0_0", leaked: "m_tokenizer_0_0"}
    scans = iter([both, both, {live: "m_tokenizer_0_0"}])
    monkeypatch.setattr(supervisor_module, "server_stubs", lambda prefix: next(scans))
    monkeypatch.setattr(supervisor_module.os, "kill", lambda pid, sig: None)
    watch = supervisor_module.Supervisor(Server())
    watch.expected, watch.retiring = {"m_tokenizer_0_0": live}, {leaked: 0.0}
    assert watch.check() == [] and reloads == [] and watch.retired == ["m_tokenizer_0_0"]
    assert watch.check() == [] and reloads == [] and watch.retired == ["m_tokenizer_0_0"]  # killed once
    assert watch.check() == [] and reloads == [] and watch.retiring == {}  # reaped: no longer retiring


def test_the_service_errors_survive_pickling() -> None:
    """Workers in other processes (multiprocessing, Ray, Celery) get the same error back, fields and all."""
    import pickle

    from pooltriton.contract.requests import ModelInfo

    model = ModelInfo(name="m", task="classify", outputs=("PROBABILITIES",), labels=("a", "b"))
    noted = Overloaded("busy", 3)
    noted.add_note("queue of 12 s")
    for error in (RequestError("too long", "input"), WrongTask(model, "embed"), noted, TooLong(9)):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and copy.args == error.args
        assert vars(copy) == vars(error)


class TooLong(RequestError):  # a subclass with an __init__ of its own, pickled by reference
    def __init__(self, tokens: int) -> None:
        super().__init__(f"{tokens} tokens", "input")


def test_the_pooler_stage_leaves_out_a_texts_first_and_last_token_only_where_they_are_those_ids(monkeypatch) -> None:
    """BGE-M3's <s> (id 0) and </s> (id 2) by position, either padding side; a text without them, an empty
    row and a one-token row are handled (the stage's function, without the Triton stub: a stand-in module)."""
    import importlib
    import sys
    import types

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    pooler = importlib.import_module("pooltriton.backends.pooler.model")
    ids = np.array([[0, 7, 8, 2, 1], [1, 1, 0, 9, 2], [7, 8, 9, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    mask = np.array([[1, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    values = ids[..., None].astype(np.float32)
    rows, counts = pooler.real_token_rows(values, mask, ids, None, 0, 2)
    assert rows[:, 0].tolist() == [7, 8, 9, 7, 8, 9] and counts.ravel().tolist() == [2, 1, 3, 0, 0]
    rows, counts = pooler.real_token_rows(values, mask, ids, None, 0, None)  # ColBERT's: <s> only
    assert rows[:, 0].tolist() == [7, 8, 2, 9, 2, 7, 8, 9] and counts.ravel().tolist() == [3, 2, 3, 0, 0]
    rows, counts = pooler.real_token_rows(values, mask, ids, None)  # every other token model: all real tokens
    assert counts.ravel().tolist() == [4, 3, 3, 0, 1]
