"""Real English text that every Python installation ships, for int8's accuracy control and retrieval check.

Quantization must be measured on the kind of text the model reads, and its retrieval check needs
real sentences (random words make neighbours near-ties, so any noise reorders them). With no model hub
or dataset download here, the source is the standard library's `pydoc_data.topics`: the Python
language reference's prose (~1,400 distinct sentences after dropping code). It is split once, by a
fixed seed, into disjoint parts: validation (what accuracy control measures while it chooses the
activation group and keeps products out of int8: 400 texts, because 100 let a group through that
missed the bound on the check's 1,000), and documents and queries for the check that the export has to
pass afterwards, so the check never sees text the quantization was tuned on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache

SOURCE = "Python's pydoc_data.topics (the language reference's prose)"
QUERY_WORDS = 8  # queries are held-out sentences cut to a search query's length


@dataclass(frozen=True)
class Corpus:
    validation: tuple[str, ...]
    documents: tuple[str, ...]
    queries: tuple[str, ...]
    source: str = SOURCE


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """Distinct prose sentences of 40-300 characters (lines of code and tables left out)."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics.values())
    found = (" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text))
    prose = (s for s in found if 40 < len(s) < 300 and sum(c.isalpha() or c == " " for c in s) / len(s) > 0.9)
    return tuple(dict.fromkeys(prose))


def corpus(validation: int = 400, documents: int = 800, queries: int = 200, seed: int = 0) -> Corpus:
    texts = list(sentences())
    wanted = validation + documents + queries
    if len(texts) < wanted:
        raise RuntimeError(f"{SOURCE} gave {len(texts)} sentences, fewer than the {wanted} needed")
    random.Random(seed).shuffle(texts)
    parts, start = [], 0
    for size in (validation, documents, queries):
        parts.append(tuple(texts[start:start + size]))
        start += size
    short = tuple(" ".join(text.split()[:QUERY_WORDS]) for text in parts[2])
    return Corpus(parts[0], parts[1], short)
