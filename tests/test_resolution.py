"""Pooler-configuration precedence, field by field, from config files alone (no weights anywhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pooltriton.core.resolve import ResolutionError, resolve


def model_dir(tmp_path: Path, architecture: str, model_type: str, *, st_pooling: dict | None = None,
              normalize: bool = False, extra: dict | None = None, name: str = "m") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    config = {"architectures": [architecture], "model_type": model_type, "max_position_embeddings": 512,
              **(extra or {})}
    (folder / "config.json").write_text(json.dumps(config))
    if st_pooling is not None:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(st_pooling))
    return folder


# (architecture, model_type, st_pooling, normalize, explicit, expected task, pooling, use_activation, sources)
POOLING_TABLE = [
    ("BertModel", "bert", None, False, {}, "embed", "CLS", True, ("architecture", "task-default")),
    ("Qwen2ForCausalLM", "qwen2", None, False, {}, "embed", "LAST", True, ("architecture", "task-default")),
    ("LlamaModel", "llama", None, False, {}, "embed", "LAST", True, ("architecture", "task-default")),
    ("BertModel", "bert", {"pooling_mode": "mean"}, True, {}, "embed", "MEAN", True,
     ("sentence-transformers", "sentence-transformers")),
    ("BertModel", "bert", {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, False, {},
     "embed", "MEAN", False, ("sentence-transformers", "sentence-transformers")),
    ("Qwen2Model", "qwen2", {"pooling_mode_lasttoken": True}, True, {}, "embed", "LAST", True,
     ("sentence-transformers", "sentence-transformers")),
    ("BertModel", "bert", {"pooling_mode_cls_token": True}, True, {"pooling_type": "MEAN"}, "embed", "MEAN", True,
     ("explicit", "sentence-transformers")),
    ("BertModel", "bert", {"pooling_mode": "cls"}, True, {"use_activation": False}, "embed", "CLS", False,
     ("sentence-transformers", "explicit")),
    ("BertModel", "bert", None, False, {"task": "token_embed"}, "token_embed", "ALL", True,
     ("task-default", "task-default")),
    ("XLMRobertaModel", "xlm-roberta", None, False, {"pooling_type": "LAST"}, "embed", "LAST", True,
     ("explicit", "task-default")),
    # A Pooling config that names no mode (or sets every one false) pools by the mean, as the library does.
    ("BertModel", "bert", {}, True, {}, "embed", "MEAN", True, ("sentence-transformers", "sentence-transformers")),
    ("Qwen2Model", "qwen2", {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False}, True, {}, "embed",
     "MEAN", True, ("sentence-transformers", "sentence-transformers")),
]


@pytest.mark.parametrize(("arch", "model_type", "st", "normalize", "explicit", "task", "pooling", "use", "sources"),
                         POOLING_TABLE)
def test_embedding_precedence(tmp_path, arch, model_type, st, normalize, explicit, task, pooling, use, sources):
    config = resolve(model_dir(tmp_path, arch, model_type, st_pooling=st, normalize=normalize), **explicit)
    assert (config.task.value, config.pooling_type.value, config.use_activation) == (task, pooling, use)
    assert (config.sources["pooling_type"], config.sources["use_activation"]) == sources


# (extra HF config, expected activation, source)
ACTIVATION_TABLE = [
    ({"num_labels": 1}, "sigmoid", "task-default"),
    ({"num_labels": 3}, "softmax", "task-default"),
    ({"id2label": {"0": "a", "1": "b"}}, "softmax", "task-default"),
    ({"num_labels": 3, "problem_type": "multi_label_classification"}, "sigmoid", "hf-config"),
    ({"num_labels": 1, "problem_type": "regression"}, "identity", "hf-config"),
    ({"num_labels": 1, "problem_type": "single_label_classification"}, "softmax", "hf-config"),
    ({"num_labels": 1, "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
     "identity", "sentence-transformers"),
    ({"num_labels": 3, "sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"},
     "sigmoid", "sentence-transformers"),
    ({"num_labels": 3, "problem_type": "regression",
      "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}, "identity", "hf-config"),
]


@pytest.mark.parametrize(("extra", "activation", "source"), ACTIVATION_TABLE)
def test_classifier_activation_precedence(tmp_path, extra, activation, source) -> None:
    config = resolve(model_dir(tmp_path, "BertForSequenceClassification", "bert", extra=extra))
    assert config.task.value == "classify" and config.pooling_type.value == "CLS"
    assert (config.activation.value, config.sources["activation"]) == (activation, source)


def test_a_cross_encoder_saved_by_sentence_transformers_6_keeps_its_activation_in_its_own_file(tmp_path) -> None:
    """sentence-transformers 6 writes a CrossEncoder's activation to config_sentence_transformers.json and
    reads it from there first; with three labels it saves Identity (softmax would be vLLM's default)."""
    folder = model_dir(tmp_path, "BertForSequenceClassification", "bert", extra={
        "num_labels": 3, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}})
    saved = folder / "config_sentence_transformers.json"
    saved.write_text(json.dumps({"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.linear.Identity"}))
    config = resolve(folder)
    assert (config.activation.value, config.sources["activation"]) == ("identity", "sentence-transformers")
    # The library reads no problem_type, and its default for more than one label is Identity.
    hf = json.loads((folder / "config.json").read_text())
    del hf["sentence_transformers"]
    (folder / "config.json").write_text(json.dumps({**hf, "problem_type": "single_label_classification"}))
    saved.write_text(json.dumps({"model_type": "CrossEncoder", "activation_fn": None}))
    assert resolve(folder).activation.value == "identity"
    saved.write_text(json.dumps({"model_type": "SentenceTransformer", "activation_fn": "os.system"}))
    assert resolve(folder).activation.value == "softmax"  # not a CrossEncoder's file: config.json's problem_type


def test_untrusted_activation_is_refused(tmp_path) -> None:
    extra = {"num_labels": 1, "sentence_transformers": {"activation_fn": "os.system"}}
    with pytest.raises(ResolutionError, match=r"only torch\.nn\.modules"):
        resolve(model_dir(tmp_path, "BertForSequenceClassification", "bert", extra=extra))


@pytest.mark.parametrize(("arch", "kwargs", "message"), [
    ("BertModel", {"task": "classify"}, "no classification head"),
    ("BertForSequenceClassification", {"task": "embed"}, "--convert embed"),
    ("BertForTokenClassification", {"task": "classify"}, "use task token_classify"),
    ("BertModel", {"task": "embed", "pooling_type": "ALL"}, "does not fit task embed"),
    ("LlamaForCausalLM", {"task": "token_classify", "pooling_type": "STEP"}, "no classification head"),
    ("LlamaModel", {"task": "token_embed", "pooling_type": "STEP"}, "STEP pooling needs"),
])
def test_a_task_the_model_cannot_serve_is_an_error(tmp_path, arch, kwargs, message) -> None:
    with pytest.raises(ResolutionError, match=message):
        resolve(model_dir(tmp_path, arch, "bert" if arch.startswith("Bert") else "llama"), **kwargs)


def test_convert_overrides_the_architecture(tmp_path) -> None:
    config = resolve(model_dir(tmp_path, "BertForSequenceClassification", "bert"), convert="embed")
    assert config.task.value == "embed" and config.sources["convert"] == "explicit"


def test_causal_lm_reward_with_step(tmp_path) -> None:
    config = resolve(model_dir(tmp_path, "LlamaForCausalLM", "llama"), task="token_classify",
                     pooling_type="STEP", step_tag_id=5, returned_token_ids=(7, 8))
    assert config.pooling_type.value == "STEP" and config.num_labels == 2 and config.activation.value == "softmax"


def test_inspect_needs_no_weights(tmp_path) -> None:
    folder = model_dir(tmp_path, "BertModel", "bert", st_pooling={"pooling_mode_mean_tokens": True}, normalize=True)
    assert not any(p.suffix in (".safetensors", ".bin") for p in folder.rglob("*"))
    out = subprocess.run([sys.executable, "-m", "pooltriton.cli", "inspect", str(folder)],
                         check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    assert (data["pooling_type"], data["use_activation"], data["max_length"]) == ("MEAN", True, 512)


def test_export_of_an_unservable_task_fails_at_export(tmp_path) -> None:
    folder = model_dir(tmp_path, "BertModel", "bert")
    (folder / "tokenizer.json").write_text("{}")
    result = subprocess.run([sys.executable, "-m", "pooltriton.cli", "export", str(folder), "--task", "classify",
                             "--name", "x", "--out", str(tmp_path / "repo")], capture_output=True, text=True)
    assert result.returncode == 2 and "no classification head" in result.stderr
    assert not (tmp_path / "repo").exists()


def test_sentence_transformers_settings_the_export_cannot_reproduce_are_refused(tmp_path) -> None:
    """Served as they stand they would be other vectors than the library's: a Normalize before a Dense (the
    export normalises the final vector only) and truncate_dim (the library cuts every vector)."""
    folder = model_dir(tmp_path, "BertModel", "bert", st_pooling={"pooling_mode": "mean"}, normalize=True)
    modules = json.loads((folder / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (folder / "modules.json").write_text(json.dumps([*modules, dense]))
    with pytest.raises(ResolutionError, match="Normalize before the Dense"):
        resolve(folder)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"truncate_dim": 128}))
    with pytest.raises(ResolutionError, match="truncate_dim 128"):
        resolve(folder)


def test_a_sparse_encoder_resolves_to_splade_and_its_unreproducible_settings_are_refused(tmp_path) -> None:
    """sentence-transformers' SparseEncoder (a masked LM, SpladePooling): SPLADE_MAX or SPLADE_SUM, raw (no
    Normalize); its log1p_relu activation and max_active_dims (top-k) would be other vectors, so refused."""
    folder = model_dir(tmp_path, "BertForMaskedLM", "bert", st_pooling={"pooling_strategy": "max",
                                                                         "activation_function": "relu"})
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    config = resolve(folder)
    assert (config.task.value, config.pooling_type.value, config.use_activation) == ("embed", "SPLADE_MAX", False)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_strategy": "sum"}))
    assert resolve(folder).pooling_type.value == "SPLADE_SUM"
    with pytest.raises(ResolutionError, match="makes an embedding"):
        resolve(folder, convert="classify", pooling_type="SPLADE_SUM")
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"max_active_dims": 64}))
    with pytest.raises(ResolutionError, match="max_active_dims"):
        resolve(folder)
    (folder / "config_sentence_transformers.json").unlink()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_strategy": "max",
                                                                  "activation_function": "log1p_relu"}))
    with pytest.raises(ResolutionError, match="log1p_relu"):
        resolve(folder)
    # sentence-transformers 5's saves: MLMTransformer, the older key for the width; a config naming no
    # strategy pools by the library's default (max).
    modules[0]["type"] = "sentence_transformers.sparse_encoder.models.MLMTransformer"
    modules[1]["type"] = "sentence_transformers.sparse_encoder.models.SpladePooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 30522}))
    assert resolve(folder).pooling_type.value == "SPLADE_MAX"
    # A query Router (inference-free SPLADE) is another pipeline: refused by name.
    router = {"idx": 2, "name": "2", "path": "2_Router", "type": "sentence_transformers.base.modules.Router"}
    (folder / "modules.json").write_text(json.dumps([*modules, router]))
    with pytest.raises(ResolutionError, match="Router"):
        resolve(folder)


def test_an_explicit_splade_pooling_serves_raw_weights(tmp_path) -> None:
    folder = model_dir(tmp_path, "BertForMaskedLM", "bert")
    config = resolve(folder, pooling_type="SPLADE_SUM")
    assert (config.pooling_type.value, config.use_activation) == ("SPLADE_SUM", False)
    assert resolve(folder, pooling_type="SPLADE_SUM", use_activation=True).use_activation


# (architecture, model_type, config keys, causal, window as |query - key| < window): transformers' masks.
ATTENTION_TABLE = [
    ("MistralModel", "mistral", {"sliding_window": 8}, True, 8),  # kv > q - 8
    # `is_causal: false` (gte-Qwen2's kind): both ways, and a window keeps |q - kv| <= 8
    ("MistralModel", "mistral", {"sliding_window": 8, "is_causal": False}, False, 9),
    ("Qwen2Model", "qwen2", {"is_causal": False, "sliding_window": 8, "use_sliding_window": False}, False, 0),
    # EmbeddingGemma: Gemma 3's flag halves the window (its config), exclusive bounds
    ("Gemma3TextModel", "gemma3_text", {"sliding_window": 8, "use_bidirectional_attention": True}, False, 5),
    # both keys: transformers halves the window and then keeps |q - kv| <= 5
    ("Gemma3TextModel", "gemma3_text", {"sliding_window": 8, "use_bidirectional_attention": True,
                                        "is_causal": False}, False, 6),
    # the flag means nothing to transformers' Qwen3 (the export refuses it, export.refusals.check_architecture)
    ("Qwen3Model", "qwen3", {"use_bidirectional_attention": True}, True, 0),
    ("BertModel", "bert", {"is_causal": False}, False, 0),  # encoders are not decoders either way
]


@pytest.mark.parametrize(("architecture", "model_type", "extra", "causal", "window"), ATTENTION_TABLE)
def test_attention_follows_what_transformers_reads_from_the_config(tmp_path, architecture, model_type, extra,
                                                                   causal, window) -> None:
    config = resolve(model_dir(tmp_path, architecture, model_type, extra=extra))
    assert (config.causal, config.sliding_window) == (causal, window)


NOMIC = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "activation_function": "swiglu",
         "causal": False, "layer_norm_epsilon": 1e-12, "max_trained_positions": 2048, "mlp_fc1_bias": False,
         "mlp_fc2_bias": False, "n_embd": 768, "n_head": 12, "n_inner": 3072, "n_layer": 12, "n_positions": 8192,
         "parallel_block": False, "prenorm": False, "qkv_proj_bias": False, "rotary_emb_base": 1000,
         "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
         "rotary_scaling_factor": None, "use_rms_norm": False, "vocab_size": 30528}
# (config.json, refused with): what check_architecture refuses before anything is loaded.
ARCHITECTURE_CHECKS = [
    ({"model_type": "mistral", "architectures": ["GritLM"]}, "neither a transformers class"),
    ({"model_type": "mistral", "architectures": ["GritLM"], "auto_map": {"AutoModel": "x.GritLM"}}, None),
    ({"model_type": "qwen3", "architectures": ["Qwen3Model"], "use_bidirectional_attention": True},
     "sets use_bidirectional_attention"),
    ({"model_type": "gemma2", "architectures": ["Gemma2Model"], "use_bidirectional_attention": True},
     "sets use_bidirectional_attention"),
    # what transformers reads for every decoder, beside what TEI and vLLM read
    ({"model_type": "qwen3", "architectures": ["Qwen3Model"], "use_bidirectional_attention": True,
      "is_causal": False}, None),
    ({"model_type": "gemma3_text", "architectures": ["Gemma3TextModel"], "use_bidirectional_attention": True}, None),
    ({"model_type": "falcon", "architectures": ["FalconModel"]}, None),  # unsupported: check_supported's message
    # nomic-embed-text v1.5's own config.json (its auto_map removed): every key as transformers' port computes
    (NOMIC, None),
    ({**NOMIC, "rotary_emb_base": 10000}, r"rotary_emb_base=10000 \(computed with rope_theta=1000.0\)"),
    ({**NOMIC, "rotary_emb_base": 10000, "rope_parameters": {"rope_type": "default", "rope_theta": 10000}}, None),
    ({**NOMIC, "n_head": 16}, r"n_head=16 \(computed with num_attention_heads=12\)"),
    ({**NOMIC, "qkv_proj_bias": True, "use_rms_norm": True}, "use_rms_norm=True .*; qkv_proj_bias=True"),
    # nomic's gated MLP is transformers' hidden_act gating: GeGLU is hidden_act gelu there
    ({**NOMIC, "activation_function": "geglu"}, r"activation_function='geglu' \(computed with hidden_act='silu'\)"),
    ({**NOMIC, "activation_function": "geglu", "hidden_act": "gelu"}, None),
    ({**NOMIC, "n_head": 16, "auto_map": {"AutoModel": "nomic.NomicBertModel"}}, None),  # its own code reads it
    # transformers 5's BERT family has no relative positions: they would be served absolute, weights dropped
    ({"model_type": "bert", "position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"model_type": "xlm-roberta", "position_embedding_type": "absolute"}, None),
    # Alibaba's own GTE keys that transformers' GteConfig does not read
    ({"model_type": "gte", "position_embedding_type": "rope", "logn_attention_scale": False}, None),
    ({"model_type": "gte", "logn_attention_scale": True}, "logn_attention_scale=True"),
    ({"model_type": "gte", "rope_theta": 160000, "rope_scaling": {"type": "ntk", "factor": 2.0}},
     "transformers has no 'ntk' rope; the same frequencies are rope_parameters"),
]


# Alibaba's own GTE configs (model_type `new`) as transformers' GteConfig reads them; their keys transformers
# ignores stay, and are refused where they change the math (as in a `gte` config).
GTE_BASE_EN = {"architectures": ["NewModel"], "auto_map": {"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"},
               "model_type": "new", "hidden_size": 768, "num_attention_heads": 12, "rope_theta": 500000,
               "rope_scaling": {"type": "ntk", "factor": 2.0}, "type_vocab_size": 0, "vocab_size": 30528,
               "layer_norm_type": "layer_norm", "logn_attention_scale": False, "logn_attention_clip1": False,
               "pack_qkv": True, "unpad_inputs": True, "use_memory_efficient_attention": True,
               "max_position_embeddings": 8192, "position_embedding_type": "rope"}


NOMIC_CODE = {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
              "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"}


@pytest.mark.parametrize(("change", "refusal"), [
    ({}, None),
    ({"n_head": 16}, r"n_head=16 \(computed with num_attention_heads=12\)"),
    ({"moe_every_n_layers": 2, "num_experts": 8}, "moe_every_n_layers=2"),  # nomic-embed-text-v2-moe
])
def test_nomics_config_naming_its_hub_code_is_read_as_transformers_port(tmp_path, change, refusal) -> None:
    """transformers reads it so without trust_remote_code (the port's own model type), and so does this."""
    from pooltriton.core.resolve import as_transformers_config
    from pooltriton.export.refusals import check_architecture

    read = as_transformers_config({**NOMIC, "auto_map": NOMIC_CODE, **change})
    assert "auto_map" not in read and read["model_type"] == "nomic_bert"
    if refusal is None:
        check_architecture(tmp_path, read)
    else:
        with pytest.raises(ResolutionError, match=refusal):
            check_architecture(tmp_path, read)
    # code named from anywhere else too is that code's to run (--trust-remote-code)
    mixed = {**NOMIC, "auto_map": {**NOMIC_CODE, "AutoModelForMaskedLM": "modeling.NomicBertForPreTraining"}}
    assert as_transformers_config(mixed) is mixed


def test_alibabas_own_gte_config_is_read_as_the_gteconfig_it_describes() -> None:
    from pooltriton.core.resolve import as_transformers_config, unread_config_keys

    read = as_transformers_config(GTE_BASE_EN)
    assert read["model_type"] == "gte" and read["architectures"] == ["GteModel"] and "auto_map" not in read
    assert read["rope_parameters"] == {"rope_type": "linear", "factor": 2.0 ** (2 / 64), "rope_theta": 1000000.0}
    assert "rope_scaling" not in read and "rope_theta" not in read and unread_config_keys(read) == []
    assert GTE_BASE_EN["model_type"] == "new"  # the file's dict is left as it was
    # NewConfig's defaults where GteConfig's differ; no scaling: the plain theta, for transformers to read
    bare = as_transformers_config({"model_type": "new", "architectures": ["NewForSequenceClassification"]})
    assert bare["architectures"] == ["GteForSequenceClassification"]
    assert (bare["vocab_size"], bare["max_position_embeddings"], bare["rope_theta"]) == (30528, 2048, 10000.0)
    # gte-multilingual-base names a token classifier without labels, and has none: TEI reads it as GteModel
    unlabelled = {**GTE_BASE_EN, "architectures": ["NewForTokenClassification"]}
    assert as_transformers_config(unlabelled)["architectures"] == ["GteModel"]
    labelled = {**unlabelled, "id2label": {"0": "O", "1": "B"}, "label2id": {"O": 0, "B": 1}}
    assert as_transformers_config(labelled)["architectures"] == ["GteForTokenClassification"]
    # their NTK as transformers 5 writes it when it saves their config again (rope_parameters)
    resaved = {**GTE_BASE_EN, "rope_parameters": {"rope_type": "ntk", "type": "ntk", "factor": 2.0,
                                                  "rope_theta": 500000.0}}
    del resaved["rope_scaling"], resaved["rope_theta"]
    assert as_transformers_config(resaved)["rope_parameters"] == read["rope_parameters"]
    # snowflake-arctic-embed-m-v2.0's kind: model_type gte, their code named
    arctic = as_transformers_config({**GTE_BASE_EN, "model_type": "gte", "architectures": ["GteModel"]})
    assert arctic["model_type"] == "gte" and "auto_map" not in arctic and "rope_parameters" in arctic
    # as transformers reads them already, or code from elsewhere (--trust-remote-code's to run)
    for config in ({"model_type": "bert", "architectures": ["BertModel"]}, {"model_type": "gte", "rope_theta": 1.0},
                   {**GTE_BASE_EN, "auto_map": {"AutoModel": "modeling.NewModel"}},
                   {**GTE_BASE_EN, "auto_map": ["Alibaba-NLP/new-impl--modeling.NewModel"]}):
        assert as_transformers_config(config) is config


@pytest.mark.parametrize(("change", "refusal"), [
    ({"logn_attention_scale": True}, "logn_attention_scale=True"),
    ({"layer_norm_type": "rms_norm"}, "layer_norm_type='rms_norm'"),
    ({"pack_qkv": False}, "pack_qkv=False"),
    ({"position_embedding_type": "absolute"}, "position_embedding_type='absolute'"),
    ({"rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}}, "nor an equivalent of this one"),
])
def test_alibabas_own_gte_variants_transformers_does_not_compute_are_refused(tmp_path, change, refusal) -> None:
    from pooltriton.core.resolve import as_transformers_config
    from pooltriton.export.refusals import check_architecture

    with pytest.raises(ResolutionError, match=refusal):
        check_architecture(tmp_path, as_transformers_config({**GTE_BASE_EN, **change}))


def test_a_refusal_of_alibabas_gte_names_the_users_folder_not_the_exports_view(tmp_path) -> None:
    import json

    from alibaba_gte import build_alibaba_gte

    from pooltriton.export.build import ExportOptions, export_model

    folder = build_alibaba_gte(tmp_path, "embed")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "logn_attention_scale": True}))
    with pytest.raises(ResolutionError) as refused:
        export_model(folder, ExportOptions(name="x", out=tmp_path / "out"))
    assert f"{folder}'s config.json sets logn_attention_scale=True" in str(refused.value)
    assert "pooltriton-" not in str(refused.value)


def test_the_rope_offered_for_alibabas_fixed_ntk_has_its_frequencies() -> None:
    """Alibaba's NTKScalingRotaryEmbedding (mixed_b unset) computes with a base of theta x factor and divides
    every frequency by factor^(2/d); the refusal offers that as transformers' linear scaling."""
    import ast

    import torch
    from transformers import GteConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from pooltriton.core.resolve import unread_config_keys

    theta, factor, hidden, heads = 160000.0, 2.0, 768, 12
    (refusal,) = unread_config_keys({"model_type": "gte", "rope_theta": theta, "hidden_size": hidden,
                                     "num_attention_heads": heads, "rope_scaling": {"type": "ntk", "factor": factor}})
    offered = ast.literal_eval(refusal[refusal.index("rope_parameters ") + len("rope_parameters "):-1])
    dim = hidden // heads
    alibaba = 1.0 / (theta * factor) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim) / factor ** (2 / dim)
    config = GteConfig(hidden_size=hidden, num_attention_heads=heads, rope_parameters=offered)
    frequencies, scale = ROPE_INIT_FUNCTIONS[offered["rope_type"]](config, "cpu")
    assert scale == 1.0 and torch.allclose(frequencies.double(), alibaba, rtol=1e-6)


@pytest.mark.parametrize(("config", "refusal"), ARCHITECTURE_CHECKS)
def test_config_keys_transformers_would_not_apply_are_refused(tmp_path, config, refusal) -> None:
    from pooltriton.export.refusals import check_architecture

    if refusal is None:
        check_architecture(tmp_path, config)
    else:
        with pytest.raises(ResolutionError, match=refusal):
            check_architecture(tmp_path, config)


def test_nomic_rotary_scaling_caps_the_length_where_transformers_agrees_with_its_own_code(tmp_path) -> None:
    """nomic's code rescales rotary positions past max_trained_positions when rotary_scaling_factor is set;
    transformers' port does not, so such a model is served up to there and no further."""
    extra = {key: value for key, value in NOMIC.items() if key not in ("model_type", "architectures")}
    extra["max_position_embeddings"] = None  # nomic's format has n_positions only
    plain = resolve(model_dir(tmp_path, "NomicBertModel", "nomic_bert", extra=extra, name="plain"))
    assert (plain.max_length, plain.sources["max_length"]) == (8192, "hf-config")
    extra["rotary_scaling_factor"] = 2
    scaled = model_dir(tmp_path, "NomicBertModel", "nomic_bert", extra=extra, name="scaled")
    config = resolve(scaled)
    assert (config.max_length, config.sources["max_length"]) == (2048, "hf-config")
    assert resolve(scaled, max_length=1024).max_length == 1024
    with pytest.raises(ResolutionError, match="past max_trained_positions"):
        resolve(scaled, max_length=4096)
    extra["auto_map"] = {"AutoModel": "modeling.NomicBertModel"}  # its own code scales, and is the reference
    own = resolve(model_dir(tmp_path, "NomicBertModel", "nomic_bert", extra=extra, name="own"))
    assert own.max_length == 8192


def test_a_static_embedding_resolves_as_the_mean_of_its_tokens_rows(tmp_path) -> None:
    """sentence-transformers' StaticEmbedding, however it is laid out (the table at the top or in its module's
    folder, model2vec's config.json beside it or none): the mean, normalised where a Normalize follows, no
    length limit of its own (8,192 unless its tokenizer.json cuts, or --max-length)."""
    from tiny_models import STATIC_LAYOUTS, build_static

    for layout in STATIC_LAYOUTS:
        folder = build_static(tmp_path, layout)
        config = resolve(folder)
        assert (config.task.value, config.pooling_type.value, config.use_activation, config.max_length,
                config.architecture, config.model_type) == ("embed", "MEAN", layout != "retrieval", 8192,
                                                            "StaticEmbedding", "static_embedding"), layout
        assert (config.sources["pooling_type"], config.sources["use_activation"],
                config.sources["max_length"]) == ("sentence-transformers", "sentence-transformers", "task-default")
        assert resolve(folder, max_length=100_000).max_length == 100_000
    module = tmp_path / "static-retrieval" / "0_StaticEmbedding"
    tokenizer = json.loads((module / "tokenizer.json").read_text())
    (module / "tokenizer.json").write_text(json.dumps({**tokenizer, "truncation": {
        "direction": "Right", "max_length": 300, "strategy": "LongestFirst", "stride": 0}}))
    config = resolve(tmp_path / "static-retrieval")
    assert (config.max_length, config.sources["max_length"]) == (300, "tokenizer-json")
    # inspect reads it without a config.json
    out = subprocess.run([sys.executable, "-m", "pooltriton.cli", "inspect", str(tmp_path / "static-st")],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out)["pooling_type"] == "MEAN"
    # what no checkpoint has is refused rather than guessed: a Dense after it
    folder = tmp_path / "static-st"
    modules = json.loads((folder / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (folder / "modules.json").write_text(json.dumps([modules[0], dense, modules[1]]))
    with pytest.raises(ResolutionError, match="Dense module after a StaticEmbedding"):
        resolve(folder)
    (folder / "modules.json").write_text(json.dumps(modules))


def test_a_static_embedding_is_exported_in_fp32_and_refused_in_int8_or_without_safetensors(tmp_path,
                                                                                          monkeypatch) -> None:
    """On a CPU with VNNI and no bf16 (whatever this one is), where auto would choose int8."""
    from tiny_models import build_static

    from pooltriton.export.build import ExportOptions, export_model

    monkeypatch.setenv("POOLTRITON_CPU_FLAGS", "avx2 fma avx512f avx512_vnni")
    folder = build_static(tmp_path, "st")
    with pytest.raises(ResolutionError, match="StaticEmbedding has none"):
        export_model(folder, ExportOptions(name="x", out=tmp_path / "out", runtime="openvino", precision="int8"))
    report = export_model(folder, ExportOptions(name="x", out=tmp_path / "out", runtime="openvino", precision="auto"))
    assert report["precision"] == "fp32" and report["passed"]
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ResolutionError, match=r"has no model\.safetensors"):
        resolve(folder)


def test_each_model_family_is_one_module_registered_by_its_model_types() -> None:
    """Adding a family is a module under core/families and a line in FAMILIES (docs/architecture.md)."""
    import importlib
    import pkgutil

    from pooltriton.core import families

    registered = {id(family) for family in families.FAMILIES}
    for module in pkgutil.iter_modules(families.__path__):
        if module.name == "family":
            continue
        own = [value for value in vars(importlib.import_module(f"{families.__name__}.{module.name}")).values()
               if isinstance(value, families.Family)]
        assert own and all(id(family) in registered for family in own), module.name
    types = [model_type for family in families.FAMILIES for model_type in family.model_types]
    assert len(types) == len(set(types))  # one family per model type
    assert families.family_of("bert").cls_default and families.family_of("qwen3").decoder
    assert families.family_of("clip").vision and not families.family_of("llava_next").supported
    assert not families.family_of("whisper").supported and not families.family_of(None).supported
