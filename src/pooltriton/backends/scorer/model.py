"""Scorer: QUERY [q] and DOCUMENTS [d] (BYTES) -> SCORES [d] (FP32), via the model's own ensemble (BLS).

Modes (from the model's task, see export): bi-encoder (cosine of embeddings), late-interaction
(MaxSim over token embeddings), cross-encoder (a 1-label classifier reads each pair together).
Shapes: 1:1, 1:N (one query, many documents), N:N (zipped). Request parameters pass through, but for
vLLM's "max_tokens_per_query" / "max_tokens_per_doc" (and "truncation_side", left: keep the end): each query
and document is first cut to that many of its own tokens, as the tokenizer stage splits it, before any pair
or template is made (vLLM's text truncation; 0: no cut).
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import (
    CalledModelError,
    ModelArgs,
    call_model,
    error_response,
    input_array,
    request_parameters,
)
from pooltriton.contract import (
    BI_ENCODER,
    CROSS_ENCODER,
    DOCUMENTS,
    LATE_INTERACTION,
    PIECES,
    PROMPT_TOKENS,
    QUERY,
    SCORES,
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNTS,
    TOKEN_PIECES,
    stages,
)
from pooltriton.contract.parameters import ScorerParameters
from pooltriton.contract.requests import TokenPieces
from pooltriton.core.scoring import cosine, maxsim, pair_up, split_tokens
from pooltriton.core.tokenization import InputError, cut_within, decode_texts

# vLLM's per-side limits (0: none), read here and not passed on.
CUTS = ("max_tokens_per_query", "max_tokens_per_doc")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        parameters = ModelArgs(args).stage(ScorerParameters)
        self.mode, self.target, self.output = parameters.mode, parameters.model, parameters.output
        # A decoder reranker reads each pair as one text of its prompt template ({query}, {document}).
        self.template = parameters.template or None
        self.tokenizer = stages(parameters.model).tokenizer

    def cut(self, queries: list[str], documents: list[str], parameters: dict) -> tuple[list[str], list[str]]:
        """Each side cut to its limit of tokens (the request's CUTS, taken out of `parameters`)."""
        limits = [parameters.pop(name, 0) for name in CUTS]
        side = parameters.pop("truncation_side", "right")
        if side not in ("left", "right"):
            raise InputError(f'truncation_side must be "left" or "right", got {side!r}')
        for name, limit in zip(CUTS, limits):
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                raise InputError(f"{name} must be 0 (no limit) or a positive number of tokens, got {limit!r}")
        sides = [queries, documents]
        for index, (name, limit) in enumerate(zip(CUTS, limits)):
            if limit:
                try:
                    sides[index] = cut_within(sides[index], limit, side != "left", self._spans)
                except InputError as error:
                    raise InputError(f"{name}: {error}") from None
        return sides[0], sides[1]

    def _spans(self, texts: list[str]) -> list[list[tuple[int, int] | None]]:
        """Each text's token spans as the model's tokenizer stage splits it (no special tokens, no prompt)."""
        pieces = call_model(self.tokenizer, {TEXT: texts}, [TOKEN_PIECES],
                            {"mode": PIECES, "add_special_tokens": False, "with_prompt": False})
        return [TokenPieces.from_json(raw).spans for raw in pieces[TOKEN_PIECES].reshape(-1)]

    def _call(self, parameters: dict, **inputs: list[str]) -> dict[str, np.ndarray]:
        outputs = [self.output, PROMPT_TOKENS] + ([TOKEN_COUNTS] if self.mode == LATE_INTERACTION else [])
        return call_model(self.target, inputs, outputs, parameters)

    def score(self, queries: list[str], documents: list[str], parameters: dict) -> tuple[np.ndarray, int]:
        """Scores, and the tokens the model read for them (usage)."""
        owner = pair_up(len(queries), len(documents))
        if self.mode == CROSS_ENCODER:
            if self.template is not None:
                pairs = {TEXT: [self.template.replace("{query}", queries[i]).replace("{document}", d)
                                for i, d in zip(owner, documents)]}
            else:
                pairs = {TEXT: [queries[i] for i in owner], TEXT_PAIR: documents}
            result = self._call(parameters, **pairs)
            return result[self.output][:, 0].astype(np.float32), int(result[PROMPT_TOKENS].sum())
        result = self._call(parameters, **{TEXT: queries + documents})
        read = int(result[PROMPT_TOKENS].sum())
        if self.mode == BI_ENCODER:
            vectors = result[self.output]
            return cosine(vectors[: len(queries)][owner], vectors[len(queries) :]), read
        tokens = split_tokens(result[self.output], result[TOKEN_COUNTS])
        query_tokens, document_tokens = tokens[: len(queries)], tokens[len(queries) :]
        return np.array([maxsim(query_tokens[q], d) for q, d in zip(owner, document_tokens)], dtype=np.float32), read

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                queries = decode_texts(input_array(request, QUERY))
                documents = decode_texts(input_array(request, DOCUMENTS))
                if not queries or not documents:
                    raise InputError(f"{QUERY} and {DOCUMENTS} each need at least one text")
                parameters = request_parameters(request)
                queries, documents = self.cut(queries, documents, parameters)
                scores, read = self.score(queries, documents, parameters)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor(SCORES, scores), pb_utils.Tensor(PROMPT_TOKENS, np.array([read], dtype=np.int64))]))
            except CalledModelError as error:  # the ensemble's own code: 400, a retryable 503, ...
                responses.append(error.response())
            except (InputError, ValueError) as error:
                responses.append(error_response(str(error)))
        return responses
