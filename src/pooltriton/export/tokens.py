"""The tokenizer to serve: the model's own library's Rust tokenizer, checked against that library on
hard texts before anything is exported (verification cannot see tokenization: it feeds both sides the
same ids). Design: docs/design.md#the-served-tokenizer-exporttokens.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

from tokenizers import Tokenizer

from pooltriton.core.resolve import EXPLICIT, HF_CONFIG, STATIC_EMBEDDING, PoolerConfig, ResolutionError
from pooltriton.core.semantics import Task, Truncation
from pooltriton.core.tokenization import TextTokenizer
from pooltriton.export.verify import sample_texts

# Case, accents, other scripts, symbols and odd whitespace: where normalisers differ.
SPECIAL_TEXTS = [
    "Hello WORLD, this is MixedCase Text.",
    "Ça va? Ünïcödé naïve café – “quoted” and ‘single’",
    "日本語のテキストと中文文本 and 한국어",
    "emoji 🙂👍 symbols © ® ™ € ¥ and numbers 3.14159, 1,000,000",
    "  two  spaces\tand\ttabs\nand a new line  ",
    "URLs https://example.com/a?b=c&d=e and e-mail someone@example.org",
]
SENTENCE_TRANSFORMERS, CROSS_ENCODER = "sentence-transformers", "sentence-transformers' CrossEncoder"
TRANSFORMERS = "transformers' AutoTokenizer"
# (texts, pairs or None, prompt or None) -> the library's (ids, token types or None) per text, unpadded.
Library = Callable[[list[str], "list[str] | None", "str | None"], list[tuple[list[int], "list[int] | None"]]]


def served_tokenizer(model_dir: Path, config: PoolerConfig, trust_remote_code: bool = False) -> TextTokenizer:
    """The library's own tokenizer, to be served (its text is `.text`), once it gives the library's ids."""
    model_dir = Path(model_dir)
    with _library(model_dir, config, trust_remote_code) as library:
        text = library.backend or (model_dir / "tokenizer.json").read_text(encoding="utf-8")
        if config.model_type == STATIC_EMBEDDING:  # its library never adds special tokens
            text = json.dumps({**json.loads(text), "post_processor": None})
        tokenizer = TextTokenizer.from_str(text, config.max_length, library.pad_token_id)
        tokenizer.chat_template, tokenizer.chat_tokens = library.chat_template, library.chat_tokens
        _check_vocabulary(model_dir, library.name, tokenizer)
        _compare(library, tokenizer, config)
    return tokenizer


def _check_vocabulary(model_dir: Path, name: str, tokenizer: TextTokenizer) -> None:
    """Tokens the library adds to the file's vocabulary (a class's default special tokens) past the
    model's embedding table would reach the encoder as ids it has no row for."""
    rows = json.loads((model_dir / "config.json").read_text()).get("vocab_size")
    in_file = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    if isinstance(rows, int) and tokenizer.vocab_size > max(rows, in_file):
        raise ResolutionError(f"{name} adds tokens to the model's vocabulary ({tokenizer.vocab_size} ids against "
                              f"{in_file} in tokenizer.json) past its {rows} embeddings: not supported")


def check_tokenization(model_dir: Path, tokenizer: TextTokenizer, config: PoolerConfig,
                       trust_remote_code: bool = False) -> int:
    """Raise ResolutionError where the library's ids differ from `tokenizer`'s on any text. Returns the
    number of texts compared."""
    with _library(Path(model_dir), config, trust_remote_code) as library:
        return _compare(library, tokenizer, config)


def _compare(library: _library, tokenizer: TextTokenizer, config: PoolerConfig) -> int:
    texts = [*SPECIAL_TEXTS, *sample_texts(8, 20, seed=5), *sample_texts(2, config.max_length * 2, seed=6)]
    compared = 0
    # A SentenceTransformer takes no pairs (its models embed single texts).
    pairs = list(reversed(texts)) if config.task is Task.CLASSIFY and library.name != SENTENCE_TRANSFORMERS else None
    prompts = (None, *(p for p in dict.fromkeys(config.prompts.values()) if p))
    for prompt, paired in [*((p, None) for p in prompts), *([(None, pairs)] if pairs else [])]:
        try:
            expected_rows = library.encode(texts, paired, prompt)
        except Exception as error:  # whatever stops the library stops the model's users too
            raise ResolutionError(f"{library.name} cannot tokenize the check's texts, so what the export serves "
                                  f"could not be compared with it ({type(error).__name__}: {error})") from None
        ours = tokenizer([(prompt or "") + text for text in texts], Truncation.END, paired)
        for row, text in enumerate(texts):
            expected, types = expected_rows[row]
            length = ours.lengths[row]
            got = ours.input_ids[row][:length].tolist()
            if expected != got:
                raise ResolutionError(_difference(library.name, text, prompt, paired is not None, expected, got,
                                                  config.max_length))
            if types is not None and types != ours.token_type_ids[row][:length].tolist():
                raise ResolutionError(f"{library.name} gives {text[:40]!r} other token types than the export's "
                                      f"tokenizer ({types[:8]}... against {ours.token_type_ids[row][:8].tolist()}"
                                      "...): the served vectors would not be the model's: not supported")
            compared += 1
    return compared


class _library:
    """The model's library as a context: its name, `encode` giving its ids, and `backend`, the JSON of its
    Rust tokenizer (None where it has none); freed on exit."""

    def __init__(self, model_dir: Path, config: PoolerConfig, trust_remote_code: bool) -> None:
        self.model_dir, self.config, self.trust_remote_code = model_dir, config, trust_remote_code
        self.model = None
        self.name = TRANSFORMERS
        self.encode: Library = self._transformers
        self.backend: str | None = None
        self.pad_token_id: int | None = None
        self.chat_template: str | None = None
        self.chat_tokens: dict[str, str] | None = None

    def __enter__(self) -> _library:
        if (self.model_dir / "modules.json").is_file():
            import sentence_transformers as st

            saved = self.model_dir / "config_sentence_transformers.json"
            kind = json.loads(saved.read_text()).get("model_type") if saved.is_file() else None
            # A CrossEncoder (sentence-transformers 6 saves one with modules.json) tokenizes pairs; a
            # SparseEncoder (SPLADE) is loaded as itself (its masked-LM head, not a bare encoder).
            loader = {"CrossEncoder": st.CrossEncoder, "SparseEncoder": st.SparseEncoder}.get(kind,
                                                                                            st.SentenceTransformer)
            self.model = loader(str(self.model_dir), device="cpu", trust_remote_code=self.trust_remote_code)
            self.name = CROSS_ENCODER if kind == "CrossEncoder" else SENTENCE_TRANSFORMERS
            self.encode = self._sentence_transformers
            tokenizer = getattr(self.model, "tokenizer", None)
        else:
            from transformers import AutoTokenizer

            try:
                self.model = tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir),
                                                                       trust_remote_code=self.trust_remote_code)
            except Exception as error:  # whatever stops transformers stops the model's users too
                raise ResolutionError(f"transformers cannot load this model's tokenizer, so what it serves could "
                                      f"not be compared with the library ({type(error).__name__}: {error})") from None
        backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
        self.backend = backend.to_str() if backend is not None else None
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None)  # where the file has no padding section
        self.chat_template, self.chat_tokens = _chat(tokenizer)
        return self

    def _sentence_transformers(self, texts: list[str], pairs: list[str] | None, prompt: str | None):
        # A limit below the library's that the model's position table sets (no longer text could be read)
        # or the user chose (--max-length): the library is asked to cut there too, so its side is compared.
        limit = ({"max_length": self.config.max_length}
                 if self.config.sources.get("max_length") in (HF_CONFIG, EXPLICIT) else {})
        made = self.model.preprocess(texts if pairs is None else list(zip(texts, pairs)), prompt=prompt, **limit)
        if "offsets" in made:  # a StaticEmbedding's: every text's ids in one row, where each starts
            ids, starts = made["input_ids"].tolist(), [*made["offsets"].tolist(), len(made["input_ids"])]
            # it reads a text whole; what the export serves is its first max_length tokens
            return [(ids[start:end][: self.config.max_length], None) for start, end in pairwise(starts)]
        return _rows(made)

    def _transformers(self, texts: list[str], pairs: list[str] | None, prompt: str | None):
        texts = [(prompt or "") + text for text in texts]
        made = self.model(texts, pairs, truncation=True, max_length=self.config.max_length)  # lists: no padding
        types = made.get("token_type_ids") or [None] * len(texts)
        return [(list(ids), list(kinds) if kinds is not None else None) for ids, kinds in zip(made["input_ids"], types)]

    def __exit__(self, *_exc) -> None:
        self.model = None
        gc.collect()


def _chat(tokenizer: object) -> tuple[str | None, dict[str, str] | None]:
    """The chat template transformers would apply (named ones: the default, as get_chat_template picks without
    tools) and the special tokens it passes the template (special_tokens_map: bos_token, ...)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template:
        return None, None
    tokens = getattr(tokenizer, "special_tokens_map", None) or {}
    return template, {str(k): v for k, v in tokens.items() if isinstance(v, str)}


def _rows(made) -> list[tuple[list[int], list[int] | None]]:
    """Each text's ids (and token types, where the library makes them) without its padding."""
    mask = made["attention_mask"].bool()
    types = made.get("token_type_ids")
    return [(made["input_ids"][row][mask[row]].tolist(),
             types[row][mask[row]].tolist() if types is not None else None) for row in range(len(mask))]


def _difference(library: str, text: str, prompt: str | None, paired: bool, expected: list[int], got: list[int],
                max_length: int) -> str:
    shown = text if len(text) <= 60 else text[:57] + "..."
    with_prompt = f" with the prompt {prompt!r}" if prompt else " paired with another text" if paired else ""
    shorter = min(len(expected), len(got))
    common = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), shorter)
    if common == shorter and len(expected) != len(got) and max(len(expected), len(got)) >= max_length:
        why = (f"it keeps {len(expected)} tokens of a long text where the export keeps {len(got)} (the export's "
               f"limit is {max_length}, the smallest of the library's max_seq_length, the tokenizer's "
               "model_max_length and the model's positions; --max-length sets it) or cuts the other side")
    else:
        why = (f"they first differ at token {common} (a chat template, lowercasing, a tokenizer class that "
               "transformers builds from code, the side a long text is cut on, or tokenizer arguments in "
               "sentence_bert_config.json or tokenizer_config.json that its Rust tokenizer does not carry)")
    return (f"{library} turns {shown!r}{with_prompt} into other token ids than the tokenizer the export "
            f"would serve: {expected[:8]}... ({len(expected)} tokens) against {got[:8]}... "
            f"({len(got)} tokens); {why}. The served vectors would not be the model's: not supported")
