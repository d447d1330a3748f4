"""Tiny models built locally: a config per architecture family, seeded weights, and a word-level
tokenizer built with the `tokenizers` library (no hub); Qwen2's is a small byte-level BPE trained here,
since transformers rebuilds a Qwen2 tokenizer's pipeline from code (and the export checks that
transformers' ids are the served ones). They cannot show that answers are good, only that the served
answers equal transformers' on the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BartConfig,
    BertConfig,
    CamembertConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPT2Config,
    GteConfig,
    LlamaConfig,
    MistralConfig,
    ModernBertConfig,
    MPNetConfig,
    NomicBertConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    RobertaConfig,
    T5Config,
    XLMRobertaConfig,
)

from corpus import VOCABULARY, varied_texts

SPECIALS = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
    "xlmr": ["<s>", "<pad>", "</s>", "<unk>"],
    "decoder": ["<pad>", "<unk>", "<step>", "<good>", "<bad>"],
    "t5": ["<pad>", "</s>", "<unk>"],
}
FAMILIES = ("bert", "xlmr", "distilbert", "gpt2", "qwen2", "llama")
ENCODERS = ("bert", "xlmr", "distilbert")
# The architectures people bring today, at a scale where numerics matter (hidden 128, 4 heads) and with
# attention windows (8 tokens) shorter than the test texts.
# mistral_bidirectional: a decoder whose config says `is_causal: false` (gte-Qwen2's kind), with a window.
MODERN = ("roberta", "camembert", "mpnet", "electra", "deberta_v2", "modernbert", "nomic_bert", "gte", "qwen3",
          "mistral", "mistral_bidirectional", "gemma", "gemma2", "gemma3", "gemma3_bidirectional")
WINDOW = 8
# ModernBERT at its real 8,192-token limit (the long-input test; not in the matrix).
LONG = "modernbert_long"
_TOKENIZER_KIND = {"distilbert": "bert", "electra": "bert", "deberta_v2": "bert", "modernbert": "bert", LONG: "bert",
                   "nomic_bert": "bert", "roberta": "xlmr", "gte": "xlmr", "camembert": "xlmr", "mpnet": "xlmr",
                   "bart": "xlmr"}
STEP_TAG = "<step>"


def _words() -> list[str]:
    words = set()
    splitter = pre_tokenizers.Whitespace()
    for word in VOCABULARY:
        words.update(piece for piece, _ in splitter.pre_tokenize_str(word.lower()))
    words.update("query document relevant answer step one two three yes no".split())
    return sorted(words)


def _byte_level_bpe(specials: list[str]) -> Tokenizer:
    """Qwen2's pipeline (NFC, its split pattern, byte-level BPE; transformers' Qwen2Tokenizer builds the
    same around the file's vocabulary and merges) with merges learnt from the test corpus."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([*varied_texts(400, seed=1, max_words=20), *_words()], trainer)
    return tokenizer


def _tokenizer(family: str) -> tuple[Tokenizer, dict]:
    kind = family if family in SPECIALS else _TOKENIZER_KIND.get(family, "decoder")
    specials = SPECIALS[kind]
    if family == "qwen2":
        tokenizer = _byte_level_bpe(specials)
        # eos named too: else transformers' Qwen2Tokenizer adds its default <|endoftext|>, an id past the
        # embedding table.
        return tokenizer, {"vocab": tokenizer.get_vocab(),
                           "tokens": {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "<pad>"}}
    vocab = {token: i for i, token in enumerate(specials + _words())}
    unk = "[UNK]" if kind == "bert" else "<unk>"
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(specials)  # matched whole, before lowercasing and splitting
    if kind == "bert":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        tokens = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    elif kind == "xlmr":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
        tokens = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
                  "cls_token": "<s>", "sep_token": "</s>"}
    elif kind == "t5":  # T5 appends </s> and nothing before
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])])
        tokens = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"}
    else:
        tokens = {"pad_token": "<pad>", "unk_token": "<unk>"}
    return tokenizer, {"vocab": vocab, "tokens": tokens}


def _config(family: str, vocab_size: int, pad_id: int, **extra):
    common = {"vocab_size": vocab_size, "pad_token_id": pad_id, "initializer_range": 0.3, **extra}
    if family == "bert":
        return BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          max_position_embeddings=128, **common)
    if family == "xlmr":
        return XLMRobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=130, type_vocab_size=1, bos_token_id=0, eos_token_id=2,
                                **common)
    if family == "distilbert":
        return DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128, **common)
    if family in MODERN or family in (LONG, "bart", "t5"):
        return _modern_config(family, common)
    if family == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=pad_id,
                          eos_token_id=pad_id, **common)
    if family == "qwen2":
        return Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=64, max_position_embeddings=128, tie_word_embeddings=False,
                           bos_token_id=None, eos_token_id=None, **common)
    return LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64, max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
                       **common)


def _modern_config(family: str, common: dict):
    size = {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 256}
    common = {**common, "initializer_range": 0.05}
    if family == "roberta":
        return RobertaConfig(**size, max_position_embeddings=130, type_vocab_size=1, bos_token_id=0, eos_token_id=2,
                             **common)
    if family == "bart":  # bart-large-mnli's family: an encoder-decoder whose head reads the last </s>
        return BartConfig(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                          max_position_embeddings=128, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                          forced_eos_token_id=2, **common)
    if family == "t5":  # sentence-t5 / GTR: T5 v1.1's gated-GELU encoder, relative position buckets
        return T5Config(d_model=128, d_kv=32, d_ff=256, num_layers=3, num_heads=4, feed_forward_proj="gated-gelu",
                        relative_attention_num_buckets=8, relative_attention_max_distance=16, eos_token_id=1,
                        decoder_start_token_id=0, tie_word_embeddings=False, **common)
    if family == "camembert":  # RoBERTa's code under its own model_type (sentence-camembert)
        return CamembertConfig(**size, max_position_embeddings=130, type_vocab_size=1, bos_token_id=0,
                               eos_token_id=2, **common)
    if family == "electra":  # its embeddings narrower than its layers (embeddings_project between)
        return ElectraConfig(**size, embedding_size=64, max_position_embeddings=128, **common)
    if family == "nomic_bert":  # nomic-embed-text: rotary positions, SwiGLU, no biases in attention
        return NomicBertConfig(**size, max_position_embeddings=128, **common)
    if family == "gte":  # gte-multilingual-base: XLM-R's vocabulary, rotary positions, gated MLP
        return GteConfig(**size, max_position_embeddings=128, type_vocab_size=1, **common)
    if family == "mpnet":
        return MPNetConfig(**size, max_position_embeddings=130, bos_token_id=0, eos_token_id=2, **common)
    if family == "deberta_v2":
        return DebertaV2Config(**size, max_position_embeddings=128, type_vocab_size=0, relative_attention=True,
                               position_buckets=16, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                               share_att_key=True, **common)
    if family in ("modernbert", LONG):
        return ModernBertConfig(**size, max_position_embeddings=8192 if family == LONG else 128,
                                global_attn_every_n_layers=3,
                                local_attention=WINDOW, cls_token_id=2, sep_token_id=3, bos_token_id=2,
                                eos_token_id=3, **common)
    decoder = {**size, "num_key_value_heads": 2, "max_position_embeddings": 128, "bos_token_id": None,
               "eos_token_id": None, **common}
    if family == "qwen3":
        return Qwen3Config(head_dim=32, tie_word_embeddings=False, **decoder)
    if family in ("mistral", "mistral_bidirectional"):
        bidirectional = {"is_causal": False} if family == "mistral_bidirectional" else {}
        return MistralConfig(sliding_window=WINDOW, **bidirectional, **decoder)
    if family == "gemma":  # Gemma 1 (bge-reranker-v2-gemma's family: a causal LM whose "Yes" logit ranks)
        return GemmaConfig(head_dim=32, **decoder)
    if family == "gemma2":
        # Soft-capping low enough to bend these scores and logits (Gemma 2's 50 and 30 would leave them
        # linear); the logits' cap shows in the reranker (tests/test_architectures.py).
        return Gemma2Config(head_dim=32, sliding_window=WINDOW, attn_logit_softcapping=2.0,
                            final_logit_softcapping=0.5, query_pre_attn_scalar=24,
                            layer_types=["sliding_attention", "full_attention", "sliding_attention"], **decoder)
    return Gemma3TextConfig(head_dim=32, sliding_window=WINDOW, sliding_window_pattern=2,
                            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                            use_bidirectional_attention=family == "gemma3_bidirectional", **decoder)


HEADS = {
    "embed": AutoModel,
    "classify": AutoModelForSequenceClassification,
    "token_classify": AutoModelForTokenClassification,
    "causal": AutoModelForCausalLM,
    "masked_lm": AutoModelForMaskedLM,
}


def build(root: Path, family: str, head: str, num_labels: int = 3, seed: int = 0,
          sentence_transformers_pooling: str | None = None) -> Path:
    """Write a model folder: config.json, model.safetensors, tokenizer.json (+ HF tokenizer files)."""
    folder = root / f"{family}-{head}-{num_labels}-{sentence_transformers_pooling or 'none'}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer, info = _tokenizer(family)
    pad_id = info["vocab"][info["tokens"]["pad_token"]]
    labels = {"id2label": {i: f"LABEL_{chr(65 + i)}" for i in range(num_labels)}} if head != "embed" else {}
    config = _config(family, len(info["vocab"]), pad_id, num_labels=num_labels, **labels)
    torch.manual_seed(seed)
    model = HEADS[head].from_config(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    if family == "nomic_bert":  # as nomic's checkpoints name their code on the hub (transformers ports it)
        saved = json.loads((folder / "config.json").read_text())
        code = "nomic-ai/nomic-bert-2048--"
        saved["auto_map"] = {"AutoConfig": f"{code}configuration_hf_nomic_bert.NomicBertConfig",
                             "AutoModel": f"{code}modeling_hf_nomic_bert.NomicBertModel",
                             "AutoModelForSequenceClassification":
                                 f"{code}modeling_hf_nomic_bert.NomicBertForSequenceClassification"}
        (folder / "config.json").write_text(json.dumps(saved, indent=2))
    # BERT, ELECTRA and NomicBERT read segment ids: the tokenizer hands them over (1s for a pair's second text).
    segments = family in ("bert", "electra", "nomic_bert")
    inputs = ["input_ids", "token_type_ids", "attention_mask"] if segments else ["input_ids", "attention_mask"]
    limit = getattr(config, "max_position_embeddings", 128) if family != "xlmr" else 128  # T5: relative positions
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=limit, model_input_names=inputs,
                                   **info["tokens"])
    fast.save_pretrained(folder)
    if sentence_transformers_pooling:
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]))
        modes = {f"pooling_mode_{m}": sentence_transformers_pooling == m
                 for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")}
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    return folder


def token_id(folder: Path, token: str) -> int:
    return json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"][token]


PROMPTS = {"query": "query: ", "passage": "document: "}


def build_st(root: Path, family: str, pooling_mode: str, dense: bool | str = False, normalize: bool = True,
             prompts: bool = False) -> Path:
    """A sentence-transformers model saved by sentence-transformers itself: the tiny `family` encoder,
    Pooling(`pooling_mode`), optionally a Dense (32 -> 24, tanh; `dense="residual"`: with use_residual, its
    config then leaving the activation to the library's default, as a hand-written one may), a Normalize,
    and prompts (PROMPTS, "query" by default)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    kind = (dense if isinstance(dense, str) else "dense") if dense else "plain"
    folder = root / (f"st-{family}-{pooling_mode}-{kind}-{'norm' if normalize else 'raw'}"
                     f"{'-prompts' if prompts else ''}")
    if (folder / "modules.json").is_file():
        return folder
    transformer = Transformer(str(build(root, family, "embed")))
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode)]
    if dense:
        torch.manual_seed(7)
        modules.append(Dense(transformer.get_embedding_dimension(), 24, activation_function=torch.nn.Tanh(),
                             use_residual=dense == "residual"))
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu", prompts=PROMPTS if prompts else None,
                        default_prompt_name="query" if prompts else None).save(str(folder))
    if dense == "residual":
        settings_file = folder / "2_Dense" / "config.json"
        settings = json.loads(settings_file.read_text())
        assert settings.pop("activation_function") == "torch.nn.modules.activation.Tanh"
        settings_file.write_text(json.dumps(settings))
    return folder


def build_sparse(root: Path, family: str, strategy: str) -> Path:
    """A SPLADE model saved by sentence-transformers' SparseEncoder itself: the tiny `family` masked LM
    (Transformer with transformer_task fill-mask) and SpladePooling(`strategy`: max or sum)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    folder = root / f"splade-{family}-{strategy}"
    if not (folder / "modules.json").is_file():
        transformer = Transformer(str(build(root, family, "masked_lm")), transformer_task="fill-mask")
        SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy=strategy)], device="cpu").save(str(folder))
    return folder


def build_cross_encoder(root: Path, family: str, num_labels: int) -> Path:
    """The tiny `family` classifier saved by sentence-transformers' CrossEncoder itself (5+: modules.json,
    its activation in config_sentence_transformers.json: Sigmoid for one label, else Identity)."""
    from sentence_transformers import CrossEncoder

    folder = root / f"ce-{family}-{num_labels}"
    if not (folder / "modules.json").is_file():
        CrossEncoder(str(build(root, family, "classify", num_labels=num_labels)), device="cpu").save(str(folder))
    return folder


def build_m3(root: Path) -> Path:
    """A BGE-M3-shaped folder: the tiny XLM-R encoder, CLS pooling and Normalize (its dense embedding), and
    FlagEmbedding's two head files beside it, saved by torch: sparse_linear.pt (hidden -> 1, its lexical
    weights) and colbert_linear.pt (hidden -> hidden, its ColBERT vectors)."""
    folder = build(root / "bge_m3", "xlmr", "embed", sentence_transformers_pooling="cls_token")
    if not (folder / "colbert_linear.pt").is_file():
        # As long as its positions reach (BGE-M3's: 8,192), where build's sentence-transformers config says 64.
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
        hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
        torch.manual_seed(11)
        sparse = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            sparse.bias.fill_(0.2)  # some tokens weigh more than 0 after the relu, some not
        torch.save(sparse.state_dict(), folder / "sparse_linear.pt")
        torch.save(torch.nn.Linear(hidden, hidden).state_dict(), folder / "colbert_linear.pt")
    return folder


STATIC_LAYOUTS = ("st", "retrieval", "model2vec")


def build_static(root: Path, layout: str) -> Path:
    """A sentence-transformers StaticEmbedding over the tiny BERT tokenizer (whose post-processor adds [CLS] and
    [SEP], which the library leaves out), 64-wide seeded vectors, as each kind of checkpoint lays it out:
    - "st": saved by sentence-transformers 6 itself (the table at the top), with a Normalize;
    - "retrieval": as static-retrieval-mrl-en-v1 (sentence-transformers 3): the module in 0_StaticEmbedding,
      no Normalize;
    - "model2vec": as model2vec's potion models: model2vec's own config.json, the module at ".", a Normalize, and
      a vocabulary-quantized table (model2vec's `embeddings` of 40 rows, each token's row by `mapping`, scaled
      by its `weights`)."""
    from safetensors.torch import save_file

    folder = root / f"static-{layout}"
    if (folder / "modules.json").is_file():
        return folder
    tokenizer, _info = _tokenizer("bert")
    torch.manual_seed(3)
    table = torch.randn(tokenizer.get_vocab_size(), 64)
    module = folder / ("0_StaticEmbedding" if layout == "retrieval" else "")
    module.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(module / "tokenizer.json"))
    if layout == "model2vec":
        vocabulary = tokenizer.get_vocab_size()
        weights = {"embeddings": table[:40].clone(), "mapping": torch.randint(0, 40, (vocabulary,)),
                   "weights": torch.rand(vocabulary) + 0.5}
    else:
        weights = {"embedding.weight": table}
    save_file(weights, str(module / "model.safetensors"))
    kind = ("sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding" if layout == "st"
            else "sentence_transformers.models.StaticEmbedding")
    modules = [{"idx": 0, "name": "0", "path": {"st": "", "retrieval": "0_StaticEmbedding"}.get(layout, "."),
                "type": kind}]
    if layout != "retrieval":
        modules.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "1_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SentenceTransformer",
                                                                         "similarity_fn_name": "cosine"}))
    if layout == "model2vec":
        (folder / "config.json").write_text(json.dumps({"model_type": "model2vec", "architectures": ["StaticModel"],
                                                        "normalize": True, "hidden_dim": 64, "seq_length": 1000000}))
    return folder


# Qwen2's kind of chat template (ChatML: a default system message, role headers, the end of text after the last
# turn) and Llama 2's (bos_token, roles that must alternate, </s> after answers: the tiny Llama has no eos_token).
CHAT_TEMPLATES = {
    "qwen2": ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
              "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}\n"
              "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
              "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
              "{%- endfor %}\n{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- else %}"
              "{{- eos_token }}{%- endif %}\n"),
    "llama": ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
              "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant') }}"
              "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
              "{% else %}{{ ' ' + message['content'] | trim + ' </s>' }}{% endif %}{% endfor %}"),
}


def with_chat_template(folder: Path, family: str) -> Path:
    """A copy of a tiny model folder whose tokenizer has CHAT_TEMPLATES[family] (chat_template.jinja, as
    transformers 5 saves one; the folder's tokenizer_config.json has none, and that file takes precedence)."""
    import shutil

    copy = folder.with_name(folder.name + "-chat")
    if not (copy / "chat_template.jinja").is_file():
        shutil.copytree(folder, copy, dirs_exist_ok=True)
        (copy / "chat_template.jinja").write_text(CHAT_TEMPLATES[family])
    return copy
