"""Text -> token ids with the model's own `tokenizer.json`, and the length rules.

Shared by the tokenizer backend, the export verification and the tests, so "what the server
tokenises" is defined once. The tokenizer file's built-in padding/truncation are switched off:
lengths come from the resolved model configuration (MiniLM's tokenizer.json says 128, the model
is used at 256).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from pooltriton.core.semantics import Truncation


class InputError(ValueError):
    """A request the model cannot take; the message is meant for the client."""


@dataclass(frozen=True)
class Batch:
    """Right-padded arrays for one request: [n, L] each."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    lengths: np.ndarray  # real tokens per text
    truncated: int  # how many texts were cut


@dataclass(frozen=True)
class TokenIds:
    """Token ids given by the client, shaped like a `tokenizers.Encoding` for padding."""

    ids: list[int]
    type_ids: list[int]


class TextTokenizer:
    # The library tokenizer's chat template and special tokens, where the export found them (export.tokens)
    chat_template: str | None = None
    chat_tokens: dict[str, str] | None = None

    def __init__(self, tokenizer_file: str, max_length: int, pad_token_id: int | None = None) -> None:
        self._setup(Path(tokenizer_file).read_text(encoding="utf-8"), max_length, pad_token_id)

    @classmethod
    def from_str(cls, text: str, max_length: int, pad_token_id: int | None = None) -> TextTokenizer:
        """From a tokenizer.json's text (the export's, before it is written anywhere)."""
        tokenizer = cls.__new__(cls)
        tokenizer._setup(text, max_length, pad_token_id)
        return tokenizer

    def _setup(self, text: str, max_length: int, pad_token_id: int | None) -> None:
        self.max_length = max_length
        self.text = text
        self._plain = Tokenizer.from_str(text)
        padding = self._plain.padding
        self._plain.no_padding()
        self._plain.no_truncation()
        # Separate instances with truncation preset (made on first use, per side and length): no
        # per-call mutation of shared state.
        self._cutters: dict[tuple[Truncation, int], Tokenizer] = {}
        self.pad_token_id = pad_token_id if pad_token_id is not None else (padding or {}).get("pad_id", 0)

    def _cutter(self, side: Truncation, length: int) -> Tokenizer:
        if (side, length) not in self._cutters:
            tokenizer = Tokenizer.from_str(self.text)
            tokenizer.no_padding()
            tokenizer.enable_truncation(length, direction="right" if side is Truncation.END else "left")
            self._cutters[(side, length)] = tokenizer
        return self._cutters[(side, length)]

    def lengths(self, texts: list[str]) -> list[int]:
        """Untruncated token counts (special tokens included), e.g. for usage accounting."""
        return [len(e.ids) for e in self._plain.encode_batch(texts)] if texts else []

    def ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.encoding(text, add_special_tokens).ids

    def encoding(self, text: str, add_special_tokens: bool = True) -> Encoding:
        """The text's tokens untruncated, with their strings, character offsets and special-token mask."""
        return self._plain.encode(text, add_special_tokens=add_special_tokens)

    def encodings(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
        """`encoding` of each text, in one call (the Rust side runs it in parallel)."""
        return self._plain.encode_batch(texts, add_special_tokens=add_special_tokens) if texts else []

    @property
    def vocab_size(self) -> int:
        return self._plain.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """vLLM's /detokenize keeps special tokens unless asked not to."""
        return self._plain.decode(ids, skip_special_tokens=skip_special_tokens)

    def check_ids(self, ids: list[int], what: str = "tokens") -> None:
        vocab = self.vocab_size
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
            raise InputError(f"{what} must be ids in [0, {vocab})")

    def limit(self, max_tokens: object) -> int:
        """A request's own token limit (vLLM's truncate_prompt_tokens): at most the model's, else refused
        as vLLM refuses it (a silent cut at the model's limit would not be what was asked); -1 or None
        means the model's."""
        if max_tokens is None or max_tokens == -1:
            return self.max_length
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InputError(f"max_tokens must be a positive integer or -1, got {max_tokens!r}")
        if max_tokens > self.max_length:
            raise InputError(f"max_tokens ({max_tokens}) is greater than the model's limit of {self.max_length} "
                             "tokens: send at most that, or -1 for the model's limit")
        return max_tokens

    def encode(
        self, texts: list[str], truncation: Truncation = Truncation.NONE, pairs: list[str] | None = None
    ) -> tuple[list[Encoding], int]:
        """Encode one request's texts (or text pairs); over-length input raises InputError unless
        truncation is asked."""
        result = self.encode_requests([(texts, pairs, truncation, self.max_length)])[0]
        if isinstance(result, InputError):
            raise result
        return result

    def encode_requests(
        self, requests: list[tuple[list[str], list[str] | None, Truncation, int]]
    ) -> list[tuple[list[Encoding], int] | InputError]:
        """Encode many requests with one `encode_batch` call per kind (single texts, pairs); the Rust
        side runs each call in parallel.

        Each request gets its encodings and its truncation count, or the InputError that rejects it
        alone: one bad request in a dynamic batch does not fail the others.
        """
        checked = [_check_texts(texts, pairs) for texts, pairs, _, _ in requests]
        singles = [t for (texts, pairs, _, _), e in zip(requests, checked) if e is None and pairs is None
                   for t in texts]
        doubles = [
            pair for (texts, pairs, _, _), e in zip(requests, checked) if e is None and pairs is not None
            for pair in zip(texts, pairs)
        ]
        encoded = {False: iter(self._plain.encode_batch(singles) if singles else []),
                   True: iter(self._plain.encode_batch(doubles) if doubles else [])}
        results: list[tuple[list[Encoding], int] | InputError] = []
        for (texts, pairs, truncation, limit), error in zip(requests, checked):
            if error is not None:
                results.append(error)
                continue
            source = encoded[pairs is not None]
            own = [next(source) for _ in texts]
            inputs = texts if pairs is None else list(zip(texts, pairs))
            results.append(self._limit(inputs, own, truncation, limit))
        return results

    def encode_ids(self, rows: list[list[int]], truncation: Truncation,
                   limit: int | None = None) -> tuple[list[TokenIds], int]:
        """Pre-tokenised input (OpenAI's token-id `input`): used as given, no special tokens added."""
        limit = limit or self.max_length
        if not rows:
            raise InputError("empty batch: send at least one input")
        vocab = self.vocab_size
        out, truncated = [], 0
        for index, ids in enumerate(rows):
            if not ids:
                raise InputError(f"input {index} has no token ids")
            if not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
                raise InputError(f"input {index}: token ids must be integers in [0, {vocab})")
            if len(ids) > limit:
                if truncation is Truncation.NONE:
                    raise InputError(f"input {index} has {len(ids)} tokens, more than this model's limit of "
                                     f"{limit} tokens; pass truncation to cut it")
                ids = ids[:limit] if truncation is Truncation.END else ids[-limit:]
                truncated += 1
            out.append(TokenIds(list(ids), [0] * len(ids)))
        return out, truncated

    def _limit(
        self, inputs: list, encodings: list[Encoding], truncation: Truncation, limit: int
    ) -> tuple[list[Encoding], int] | InputError:
        too_long = [i for i, e in enumerate(encodings) if len(e.ids) > limit]
        if not too_long:
            return encodings, 0
        if truncation is Truncation.NONE:
            first = too_long[0]
            return InputError(
                f"text {first} has {len(encodings[first].ids)} tokens, more than this model's limit of "
                f"{limit} tokens ({len(too_long)} text(s) too long); shorten it or pass the "
                'request parameter "truncate": "END" (or "START") to truncate'
            )
        cut = self._cutter(truncation, limit).encode_batch([inputs[i] for i in too_long])
        for index, encoding in zip(too_long, cut):
            encodings[index] = encoding
        return encodings, len(too_long)

    def pad(
        self, encodings: list[Encoding], buckets: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Right-pad to the longest text, or up to the next bucket length when buckets are given."""
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        # at least one position: a text may have no tokens (a StaticEmbedding's white space: a zero vector)
        width = max(int(lengths.max()), 1)
        if buckets:
            width = next((b for b in buckets if b >= width), width)
        ids = np.full((len(encodings), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            n = lengths[row]
            ids[row, :n] = encoding.ids
            mask[row, :n] = 1
            types[row, :n] = encoding.type_ids
        return ids, mask, types, lengths

    def __call__(
        self, texts: list[str], truncation: Truncation = Truncation.NONE, pairs: list[str] | None = None
    ) -> Batch:
        encodings, truncated = self.encode(texts, truncation, pairs)
        ids, mask, types, lengths = self.pad(encodings)
        return Batch(ids, mask, types, lengths, truncated)


def cut_text(text: str, spans: Sequence[tuple[int, int] | None], limit: int, keep_start: bool = True) -> str:
    """`text` cut to its first (`keep_start`) or last `limit` tokens, from its tokens' character `spans` (None:
    a special token, not counted): vLLM's max_tokens_per_doc / max_tokens_per_query as it cuts text before a
    template. The cut falls between two tokens that share no character (bytes of one character can be two
    tokens; "" where the first or last character alone is more than `limit` tokens); a cut from the end keeps
    the space before its first token. Read again, a word cut in two can be other pieces than it was (the
    scorer reads the cut texts again); 0 or a text within its limit: unchanged."""
    real = [span for span in spans if span is not None]
    if limit <= 0 or len(real) <= limit:
        return text
    if keep_start:
        # The last boundary at or before token `limit` that no character straddles.
        end = next((k for k in range(limit, 0, -1) if real[k][0] >= real[k - 1][1]), 0)
        return text[: real[end - 1][1]] if end else ""
    start = next((k for k in range(len(real) - limit, len(real)) if real[k][0] >= real[k - 1][1]), len(real))
    return text[real[start - 1][1] :] if start < len(real) else ""


def cut_within(texts: list[str], limit: int, keep_start: bool,
               read: Callable[[list[str]], list[Sequence[tuple[int, int] | None]]], rounds: int = 4) -> list[str]:
    """Texts over `limit` tokens cut (`cut_text`) and read again (`read`: each text's token spans, as the
    model's tokenizer splits it): a word cut in two can be more pieces alone, so what is still over is cut
    again; each round shortens it. InputError where a cut leaves nothing."""
    for _ in range(rounds):
        spans = read(texts)
        over = [sum(span is not None for span in row) > limit for row in spans]
        if not any(over):
            break
        texts = [cut_text(text, row, limit, keep_start) if cut else text
                 for text, row, cut in zip(texts, spans, over, strict=True)]
        empty = next((index for index, text in enumerate(texts) if not text), None)
        if empty is not None:
            raise InputError(f"a limit of {limit} tokens leaves nothing of text {empty}: its "
                             f"{'first' if keep_start else 'last'} character alone is more tokens")
    return texts


def empty_batch(texts: list[str]) -> InputError | None:
    """A request of no texts (Triton's front end refuses one; a BLS caller may still send it)."""
    return None if texts else InputError("empty batch: send at least one text")


def _check_texts(texts: list[str], pairs: list[str] | None = None) -> InputError | None:
    if error := empty_batch(texts):
        return error
    if pairs is not None and len(pairs) != len(texts):
        return InputError(f"TEXT_PAIR has {len(pairs)} texts but TEXT has {len(texts)}: they pair up one to one")
    for name, items in (("text", texts), ("text pair", pairs or [])):
        for index, text in enumerate(items):
            if not text:
                return InputError(f"{name} {index} is empty: every input needs at least one character")
    return None


def decode_texts(raw: np.ndarray) -> list[str]:
    """Triton BYTES tensor [n, 1] (or [n]) -> str; non-UTF-8 input is a client error, not a crash."""
    texts = []
    for index, item in enumerate(raw.reshape(-1)):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(f"text {index} is not valid UTF-8 ({error.reason} at byte {error.start})") from None
        texts.append(str(item))
    return texts
