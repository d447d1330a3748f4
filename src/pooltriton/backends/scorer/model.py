"""Scorer: QUERY [q] and DOCUMENTS [d] (BYTES) -> SCORES [d] (FP32), via the model's own ensemble (BLS).

Modes (from the model's task, see export): bi-encoder (cosine of embeddings), late-interaction
(MaxSim over token embeddings), cross-encoder (a 1-label classifier reads each pair together).
Shapes: 1:1, 1:N (one query, many documents), N:N (zipped). Request parameters pass through.
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
    PROMPT_TOKENS,
    QUERY,
    SCORES,
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNTS,
)
from pooltriton.contract.parameters import ScorerParameters
from pooltriton.core.scoring import cosine, maxsim, pair_up, split_tokens
from pooltriton.core.tokenization import InputError, decode_texts


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        parameters = ModelArgs(args).stage(ScorerParameters)
        self.mode, self.target, self.output = parameters.mode, parameters.model, parameters.output
        # A decoder reranker reads each pair as one text of its prompt template ({query}, {document}).
        self.template = parameters.template or None

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
                scores, read = self.score(queries, documents, request_parameters(request))
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor(SCORES, scores), pb_utils.Tensor(PROMPT_TOKENS, np.array([read], dtype=np.int64))]))
            except CalledModelError as error:  # the ensemble's own code: 400, a retryable 503, ...
                responses.append(error.response())
            except (InputError, ValueError) as error:
                responses.append(error_response(str(error)))
        return responses
