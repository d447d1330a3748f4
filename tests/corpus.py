"""Deterministic varied texts for parity tests: unicode, punctuation, long words, 1..~250 tokens."""

from __future__ import annotations

import random

VOCABULARY = (
    "the a man woman child dog eats food bread runs quickly over under bridge river city night day "
    "Triton server embeds pooling vectors tokens model Bayesian transformer-based state-of-the-art "
    "café naïve résumé Zürich São_Paulo 東京 北京大学 Ελληνικά русский язык العربية हिन्दी 😀 🚀 ✓ "
    "hello, world! (parenthesised) [bracketed] {braced} \"quoted\" 'single' semi;colon colon: dash—em "
    "ellipsis… 3.14159 1,000,000 $42.50 100% e-mail@example.org https://example.com/path?q=1 #hash @user "
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis floccinaucinihilipilification"
).split()


def varied_texts(count: int, seed: int = 0, max_words: int = 150) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        # Spread lengths: many short, some long.
        words = 1 if index % 17 == 0 else rng.randint(1, max_words if index % 3 else 12)
        text = " ".join(rng.choice(VOCABULARY) for _ in range(words))
        if index % 5 == 0:
            text = text.capitalize() + rng.choice([".", "?", "!", "..."])
        texts.append(text)
    return texts


def texts_by_token_length(count: int, word_tokens, seed: int = 0, max_tokens: int = 250) -> list[str]:
    """Texts whose token counts (with 2 special tokens) spread over 3..max_tokens.

    `word_tokens(word) -> int` counts a word's tokens; for whitespace pre-tokenisers (BERT) a text's
    count is the sum over its words, so no text needs re-tokenising.
    """
    rng = random.Random(seed)
    cost = {word: word_tokens(word) for word in VOCABULARY}
    texts = []
    for index in range(count):
        target = 1 + (index * (max_tokens - 3)) // max(count - 1, 1)  # evenly from 1 to max-2
        words, used = [], 0
        while True:
            word = rng.choice(VOCABULARY)
            if used + cost[word] > target:
                if words:
                    break
                continue
            words.append(word)
            used += cost[word]
        texts.append(" ".join(words))
    rng.shuffle(texts)
    return texts
