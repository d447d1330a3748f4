"""The token ids the model's own library makes, against the export's tokenizer.

Verification feeds the same token ids to the export and to the reference, so it cannot see a difference
in how text becomes tokens: a chat template sentence-transformers applies to a decoder's texts, a
lowercasing step (`do_lower_case`), tokenizer arguments in sentence_bert_config.json, a tokenizer class
that transformers rebuilds from code and tokenizer_config.json instead of reading tokenizer.json (Qwen2,
BERT), another maximum length or truncation side. The served vectors would be another text's. So before
anything is exported, the ids of the library a user of the model runs are compared with the export's
tokenizer's: `SentenceTransformer.preprocess` for a sentence-transformers model (each of its prompts
too), `CrossEncoder.preprocess` for its cross-encoders, else transformers' `AutoTokenizer` (as vLLM
loads it); text pairs too for a classifier, which scores pairs. The export is refused on any difference.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from pooltriton.core.resolve import EXPLICIT, HF_CONFIG, PoolerConfig, ResolutionError
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
# (texts, pairs or None, prompt or None) -> the library's ids per text, without padding.
Library = Callable[[list[str], "list[str] | None", "str | None"], list[list[int]]]


def check_tokenization(model_dir: Path, tokenizer: TextTokenizer, config: PoolerConfig,
                       trust_remote_code: bool = False) -> int:
    """Raise ResolutionError where the library's ids differ from `tokenizer`'s on any text. Returns the
    number of texts compared."""
    texts = [*SPECIAL_TEXTS, *sample_texts(8, 20, seed=5), *sample_texts(2, config.max_length * 2, seed=6)]
    with _library(Path(model_dir), config, trust_remote_code) as (name, library):
        compared = 0
        # A SentenceTransformer takes no pairs (its models embed single texts).
        pairs = list(reversed(texts)) if config.task is Task.CLASSIFY and name != SENTENCE_TRANSFORMERS else None
        prompts = (None, *(p for p in dict.fromkeys(config.prompts.values()) if p))
        for prompt, paired in [*((p, None) for p in prompts), *([(None, pairs)] if pairs else [])]:
            expected_rows = library(texts, paired, prompt)
            ours = tokenizer([(prompt or "") + text for text in texts], Truncation.END, paired)
            for row, text in enumerate(texts):
                expected = expected_rows[row]
                got = ours.input_ids[row][: ours.lengths[row]].tolist()
                if expected != got:
                    raise ResolutionError(_difference(name, text, prompt, paired is not None, expected, got,
                                                      config.max_length))
                compared += 1
    return compared


class _library:
    """The model's library as a context: (its name, a function giving its ids); freed on exit."""

    def __init__(self, model_dir: Path, config: PoolerConfig, trust_remote_code: bool) -> None:
        self.model_dir, self.config, self.trust_remote_code = model_dir, config, trust_remote_code
        self.model = None

    def __enter__(self) -> tuple[str, Library]:
        # A limit below the library's that the model's position table sets (no longer text could be read)
        # or the user chose (--max-length): the library is asked to cut there too, so its side is compared.
        max_length = self.config.max_length
        if (self.model_dir / "modules.json").is_file():
            import sentence_transformers as st

            saved = self.model_dir / "config_sentence_transformers.json"
            kind = json.loads(saved.read_text()).get("model_type") if saved.is_file() else None
            # A CrossEncoder (sentence-transformers 5+ saves one with modules.json) tokenizes pairs.
            library = st.CrossEncoder if kind == "CrossEncoder" else st.SentenceTransformer
            self.model = library(str(self.model_dir), device="cpu", trust_remote_code=self.trust_remote_code)
            limit = ({"max_length": max_length} if self.config.sources.get("max_length") in (HF_CONFIG, EXPLICIT)
                     else {})

            def sentence_transformers(texts: list[str], pairs: list[str] | None, prompt: str | None):
                made = self.model.preprocess(texts if pairs is None else list(zip(texts, pairs)), prompt=prompt,
                                             **limit)
                return list(_unpadded(made["input_ids"], made["attention_mask"]))

            name = CROSS_ENCODER if kind == "CrossEncoder" else SENTENCE_TRANSFORMERS
            return name, sentence_transformers
        from transformers import AutoTokenizer

        try:
            self.model = AutoTokenizer.from_pretrained(str(self.model_dir), trust_remote_code=self.trust_remote_code)
        except Exception as error:  # whatever stops transformers stops the model's users too
            raise ResolutionError(f"transformers cannot load this model's tokenizer, so what it serves could not be "
                                  f"compared with the library ({type(error).__name__}: {error})") from None

        def transformers(texts: list[str], pairs: list[str] | None, prompt: str | None):
            texts = [(prompt or "") + text for text in texts]
            made = self.model(texts, pairs, truncation=True, max_length=max_length)
            return [list(ids) for ids in made["input_ids"]]

        return TRANSFORMERS, transformers

    def __exit__(self, *_exc) -> None:
        self.model = None
        gc.collect()


def _unpadded(ids, mask) -> Iterator[list[int]]:
    mask = mask.bool()
    for row in range(len(ids)):
        yield ids[row][mask[row]].tolist()


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
               "sentence_bert_config.json or tokenizer_config.json that tokenizer.json does not carry)")
    return (f"{library} turns {shown!r}{with_prompt} into other token ids than the export's "
            f"tokenizer (tokenizer.json): {expected[:8]}... ({len(expected)} tokens) against {got[:8]}... "
            f"({len(got)} tokens); {why}. The served vectors would not be the model's: not supported")
