"""Tokenizer stage: TEXT (BYTES [n, 1]) and optional TEXT_PAIR -> input_ids, attention_mask, token_type_ids
and PROMPT_TOKENS (tokens per text after truncation, for usage).

Each request is padded to its own longest text (or to a bucket length); the encoder batches the
ragged results. Per-request parameters: "truncate": NONE (default: reject over-length), END, START;
"max_tokens": a lower limit than the model's (vLLM's truncate_prompt_tokens); "use_activation" becomes
ACTIVATE for an embed encoder, which normalises in its graph. Admission by work: a request whose tokens
could not clear the encoder within its queue timeout, behind the work queued there, is refused at once
(UNAVAILABLE, retryable; backends.workboard). Called on its own,
"mode" "tokenize" (with "add_special_tokens") returns a text's ids untruncated, "pieces" (with
"add_special_tokens", "prompt_name", "with_prompt") TOKEN_PIECES: each text's tokens with their strings and spans, and
"detokenize" (TEXT items are JSON lists of ids, optional "skip_special_tokens") returns DETOKENIZED texts.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import (
    Counters,
    ModelArgs,
    error_response,
    input_array,
    queue_timeout_s,
    request_parameters,
    request_timeout_s,
    use_activation,
)
from pooltriton.backends.workboard import TokenizerRow, board_path, stub_argv
from pooltriton.contract import (
    ACTIVATE,
    ATTENTION_MASK,
    DETOKENIZE,
    DETOKENIZED,
    INPUT_IDS,
    PIECES,
    PROMPT_TOKENS,
    TEXT,
    TEXT_PAIR,
    TOKEN_PIECES,
    TOKEN_TYPE_IDS,
    TOKENIZE,
)
from pooltriton.contract.admission import Refusal, retry_phrase
from pooltriton.contract.parameters import TokenizerParameters
from pooltriton.contract.requests import TokenPieces, text_array
from pooltriton.core.semantics import Truncation
from pooltriton.core.tokenization import InputError, TextTokenizer, TokenIds, decode_texts, empty_batch


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        parameters = model.stage(TokenizerParameters)
        self.tokenizer = TextTokenizer(str(model.version_dir / parameters.tokenizer_file),
                                       max_length=parameters.max_length, pad_token_id=parameters.pad_token_id)
        self.outputs = list(parameters.outputs)
        self.buckets = None if parameters.pad_to_buckets is None else list(parameters.pad_to_buckets)
        self.prompts = parameters.prompts
        self.default_prompt = parameters.default_prompt_name
        self.use_activation = parameters.use_activation
        self.counters = Counters(model.name, ("pooltriton_truncations_total",))
        self.encoder = parameters.encoder
        self.board = None
        path = board_path(stub_argv(), parameters.encoder) if parameters.encoder else None
        deadline_s = queue_timeout_s(model.config)
        if path is not None and deadline_s > 0:
            try:
                self.board = TokenizerRow(path, deadline_s)
            except OSError as error:
                pb_utils.Logger.log_warn(f"{model.name}: no admission by work ({error})")

    def finalize(self) -> None:
        self.counters.close()
        if self.board is not None:
            self.board.close()

    def execute(self, requests: list) -> list:
        # Per request: an InputError, finished encodings (token-id input), or texts to encode; all text
        # requests then share one encode_batch call.
        parsed: list = []
        activate: list[bool] = []  # per request (ACTIVATE, read by an embed encoder)
        encodes: list[bool] = []  # per request: its tokens go on to the encoder (not tokenize mode)
        for request in requests:
            try:
                parameters = request_parameters(request)
                activate.append(use_activation(parameters, self.use_activation))
                texts = decode_texts(input_array(request, TEXT))
                if error := empty_batch(texts):  # every mode (tokenize mode would fail the batch in `pad`)
                    raise error
                mode = parameters.get("mode")
                encodes.append(mode not in (TOKENIZE, DETOKENIZE, PIECES))
                if mode == DETOKENIZE:
                    parsed.append(self._detokenize(texts, parameters))
                    continue
                if mode == PIECES:  # with the model's prompt unless "with_prompt" is false (vLLM's /tokenize)
                    prompt = self._prompt(parameters.get("prompt_name")) if parameters.get("with_prompt", True) else ""
                    parsed.append(self._pieces([prompt + t for t in texts],
                                               bool(parameters.get("add_special_tokens", True))))
                    continue
                if mode == TOKENIZE:
                    special = parameters.get("add_special_tokens", True)
                    parsed.append(([TokenIds(ids, [0] * len(ids)) for ids in
                                    (self.tokenizer.ids(t, add_special_tokens=bool(special)) for t in texts)], 0))
                    continue
                truncation = Truncation.parse(parameters.get("truncate"))
                limit = self.tokenizer.limit(parameters.get("max_tokens"))
                if parameters.get("input_format") == "token_ids":
                    parsed.append(self.tokenizer.encode_ids(_id_rows(texts), truncation, limit))
                    continue
                pair_array = input_array(request, TEXT_PAIR)
                pairs = decode_texts(pair_array) if pair_array is not None else None
                prompt = self._prompt(parameters.get("prompt_name"))
                parsed.append([[prompt + t for t in texts] if prompt else texts, pairs, truncation, limit])
            except (InputError, ValueError) as error:
                parsed.append(InputError(str(error)))
            activate += [False] * (len(parsed) - len(activate))
            encodes += [False] * (len(parsed) - len(encodes))
        encoded = iter(self.tokenizer.encode_requests([tuple(p) for p in parsed if isinstance(p, list)]))
        results = [next(encoded) if isinstance(item, list) else item for item in parsed]
        padded = [self.tokenizer.pad(result[0], self.buckets) if isinstance(result, tuple) else None
                  for result in results]
        # Admission by work for the requests that go on to the encoder, the board read once per batch.
        going = [index for index, arrays in enumerate(padded) if arrays is not None and encodes[index]]
        refusals = dict(zip(going, self.board.admit_all([int(padded[i][3].sum()) for i in going],
                                                        timeouts_s=[request_timeout_s(requests[i]) for i in going]),
                            strict=True)) if self.board is not None and going else {}
        responses = []
        for index, (result, activated) in enumerate(zip(results, activate, strict=True)):
            if isinstance(result, pb_utils.InferenceResponse):
                responses.append(result)
            elif isinstance(result, InputError):
                responses.append(error_response(str(result)))
            elif refusals.get(index) is not None:
                responses.append(self._refusal(refusals[index]))
            else:
                self.counters.add("pooltriton_truncations_total", result[1])
                responses.append(self._response(padded[index], activated))
        return responses

    def _prompt(self, name: object) -> str:
        """The prompt a request names (sentence-transformers' prompt_name), else the model's default."""
        if name is None:
            return self.prompts.get(self.default_prompt, "") if self.default_prompt else ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InputError(f"unknown prompt_name {name!r}: this model's prompts are {known}")
        return self.prompts[name]

    def _refusal(self, refusal: Refusal) -> object:
        return error_response(
            f"overloaded: {self.encoder} has ~{refusal.wait_s:.1f} s of work queued with this request's, "
            f"over the {refusal.limit_s:g} s it admits for such a request within its {self.board.deadline_s:g} s queue "
            f"timeout; {retry_phrase(refusal)}", pb_utils.TritonError.UNAVAILABLE)

    def _response(self, padded: tuple, activate: bool) -> object:
        ids, mask, types, lengths = padded
        arrays = {INPUT_IDS: ids, ATTENTION_MASK: mask, TOKEN_TYPE_IDS: types, PROMPT_TOKENS: lengths.reshape(-1, 1),
                  ACTIVATE: np.full((len(ids), 1), int(activate), dtype=np.int64)}
        return pb_utils.InferenceResponse([pb_utils.Tensor(n, np.ascontiguousarray(arrays[n]))
                                           for n in (*self.outputs, PROMPT_TOKENS)])

    def _detokenize(self, texts: list[str], parameters: dict) -> object:
        rows = _id_rows(texts)
        for ids in rows:
            self.tokenizer.check_ids(ids)
        skip = bool(parameters.get("skip_special_tokens", False))
        decoded = [self.tokenizer.decode(ids, skip_special_tokens=skip) for ids in rows]
        return pb_utils.InferenceResponse([pb_utils.Tensor(DETOKENIZED, text_array(decoded, batched=True))])


    def _pieces(self, texts: list[str], add_special_tokens: bool) -> object:
        pieces = []
        for text, encoding in zip(texts, self.tokenizer.encodings(texts, add_special_tokens), strict=True):
            special = [bool(flag) for flag in encoding.special_tokens_mask]
            spans = [None if flag else (start, stop) for flag, (start, stop) in zip(special, encoding.offsets)]
            pieces.append(TokenPieces(text, encoding.ids, encoding.tokens, special, spans).to_json())
        return pb_utils.InferenceResponse([pb_utils.Tensor(TOKEN_PIECES, text_array(pieces, batched=True))])


def _id_rows(texts: list[str]) -> list[list[int]]:
    """Token-id input (input_format=token_ids): each TEXT item is a JSON list of integers."""
    rows = []
    for index, text in enumerate(texts):
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, list):
            raise InputError(f"token_ids input: TEXT item {index} is not a JSON list of integers")
        rows.append(row)
    return rows
