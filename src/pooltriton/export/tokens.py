"""A sentence-transformers model's token ids as its library makes them, against the export's tokenizer.

Verification feeds the same token ids to the export and to the reference, so it cannot see a difference
in how text becomes tokens: a chat template sentence-transformers applies to a decoder's texts, a
lowercasing step (`do_lower_case`), tokenizer arguments in sentence_bert_config.json, a tokenizer class
that rebuilds its normalisation from tokenizer_config.json instead of tokenizer.json, another maximum
length or truncation side. The served vectors would be another text's. So before anything is exported,
the ids `SentenceTransformer.preprocess` makes are compared with the export's tokenizer's, with each of
the model's prompts too, and the export is refused on any difference.
"""

from __future__ import annotations

import gc
from pathlib import Path

from pooltriton.core.resolve import EXPLICIT, HF_CONFIG, PoolerConfig, ResolutionError
from pooltriton.core.semantics import Truncation
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


def check_tokenization(model_dir: Path, tokenizer: TextTokenizer, config: PoolerConfig,
                       trust_remote_code: bool = False) -> int:
    """Raise ResolutionError where sentence-transformers' ids differ from `tokenizer`'s on any text (a
    model without modules.json is not a sentence-transformers model: nothing to compare, 0). Returns the
    number of texts compared."""
    if not (Path(model_dir) / "modules.json").is_file():
        return 0
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", trust_remote_code=trust_remote_code)
    texts = [*SPECIAL_TEXTS, *sample_texts(8, 20, seed=5), *sample_texts(2, config.max_length * 2, seed=6)]
    compared = 0
    # A limit below the library's that the model's position table sets (no longer text could be read) or
    # the user chose (--max-length): the library is asked to cut there too, so its side is still compared.
    cut_on_purpose = config.sources.get("max_length") in (HF_CONFIG, EXPLICIT)
    try:
        for prompt in (None, *(p for p in dict.fromkeys(config.prompts.values()) if p)):
            limit = {"max_length": config.max_length} if cut_on_purpose else {}
            theirs = model.preprocess(texts, prompt=prompt, **limit)
            ids, mask = theirs["input_ids"], theirs["attention_mask"].bool()
            ours = tokenizer([(prompt or "") + text for text in texts], Truncation.END)
            for row, text in enumerate(texts):
                expected = ids[row][mask[row]].tolist()
                got = ours.input_ids[row][: ours.lengths[row]].tolist()
                if expected != got:
                    raise ResolutionError(_difference(text, prompt, expected, got, config.max_length))
                compared += 1
    finally:
        del model
        gc.collect()
    return compared


def _difference(text: str, prompt: str | None, expected: list[int], got: list[int], max_length: int) -> str:
    shown = text if len(text) <= 60 else text[:57] + "..."
    with_prompt = f" with the prompt {prompt!r}" if prompt else ""
    shorter = min(len(expected), len(got))
    common = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), shorter)
    if common == shorter and len(expected) != len(got) and max(len(expected), len(got)) >= max_length:
        why = (f"it keeps {len(expected)} tokens of a long text where the export keeps {len(got)} (the export's "
               f"limit is {max_length}, the smallest of sentence-transformers' max_seq_length, the tokenizer's "
               "model_max_length and the model's positions; --max-length sets it) or cuts the other side")
    else:
        why = (f"they first differ at token {common} (a chat template, lowercasing, the side a long text is cut "
               "on, or tokenizer arguments in sentence_bert_config.json or tokenizer_config.json that "
               "tokenizer.json does not carry)")
    return (f"sentence-transformers turns {shown!r}{with_prompt} into other token ids than the export's "
            f"tokenizer (tokenizer.json): {expected[:8]}... ({len(expected)} tokens) against {got[:8]}... "
            f"({len(got)} tokens); {why}. The served vectors would not be the model's: not supported")
