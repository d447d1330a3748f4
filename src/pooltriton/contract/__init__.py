"""The contract of a served model: tensor and stage names, batch limits, score modes and priority levels.

Written by export, read by the stages inside Triton, the clients, the gateway and the benchmark: one
module, so that no name or limit is spelled twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pooltriton.core.semantics import Task

# ---- the public ensemble ----------------------------------------------------------------------------
TEXT, TEXT_PAIR = "TEXT", "TEXT_PAIR"  # BYTES [n, 1]; TEXT_PAIR optional (cross-encoders)
OUTPUT_NAMES = {Task.EMBED: "EMBEDDING", Task.CLASSIFY: "PROBABILITIES",
                Task.TOKEN_EMBED: "TOKEN_EMBEDDINGS", Task.TOKEN_CLASSIFY: "TOKEN_PROBABILITIES"}
# Token tasks: rows of all texts concatenated, TOKEN_COUNTS [n, 1] says how many belong to each text.
TOKEN_COUNTS = "TOKEN_COUNTS"
# INT64: the tokens the model read per text ([n, 1] from ensembles, after truncation) or in all
# ([1] from scorers): what usage reports, so no client tokenizes a second time.
PROMPT_TOKENS = "PROMPT_TOKENS"
# Every batched model's max_batch_size: clients split bigger inputs into requests of at most this.
MAX_BATCH_SIZE = 128
# Request priority on the batched stages, lower first; ensembles pass it through. 1: asked high (and the
# supervisor's canaries), 2: a short request at the default priority (it runs ahead of long batches queued
# at the default, as a query during a flood should), 3: the default (any caller that names none), 4: low.
PRIORITY_LEVELS = 4
PRIORITY_SHORT = 2
DEFAULT_PRIORITY_LEVEL = 3
# Bounded queues on every batched stage (export --queue-size / --queue-timeout-ms). 128 waiting requests
# absorb a burst of as many clients (the benchmark's 64 single-text clients; requests of up to 128 texts
# each); past that a request is rejected at once (the bound is per priority level, as Triton keeps them).
# One waiting longer than the timeout is rejected then:
# at ~1.4 requests of 32 texts per second on 2 cores (docs/performance.md), 30 s is ~40 such requests.
QUEUE_SIZE, QUEUE_TIMEOUT_MS = 128, 30_000
# Export defaults the command line shares with ExportOptions: the encoder's intra-op threads (one per
# core of the 2-core machines measured), and two tokenizer instances, since Triton's batcher under a queue
# policy starts a waiting request only when one arrives while an instance idles (docs/performance.md): a
# busy one alone left refusals waiting up to 0.5 s.
ENCODER_THREADS, TOKENIZER_INSTANCES = 2, 2
# Triton's APIs that are not inference, health or metadata answer only requests carrying this header
# with the server's admin key (docs/security.md): shared-memory registration, the model repository
# (index, load, unload), statistics, trace and logging settings.
ADMIN_HEADER = "pooltriton-admin-key"
ADMIN_KEY_ENV = "POOLTRITON_ADMIN_KEY"
RESTRICTED_APIS = ("shared-memory", "model-repository", "statistics", "trace", "logging")


def admin_headers(key: str, protocol: str) -> dict[str, str]:
    """The header that opens the restricted APIs: over gRPC Triton expects it under a prefix."""
    return {("triton-grpc-protocol-" if protocol == "grpc" else "") + ADMIN_HEADER: key}


# The request parameters an ensemble understands (a plugin passes these on to the model it wraps).
ENCODE_PARAMETERS = ("truncate", "max_tokens", "use_activation", "prompt_name")
# What the gateway tells a client it turned away for overload (HTTP 429 Retry-After, seconds).
RETRY_AFTER_S = 1

# ---- the stages between tokenizer, encoder and pooler -----------------------------------------------
INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS = "input_ids", "attention_mask", "token_type_ids"
ENCODER_OUTPUT = "pooled"
# Embed: INT64 [n, 1] from the tokenizer stage, 1 where a text's vector is normalised (the request's
# use_activation, else the model's default). The encoder graph normalises, so an embed ensemble ends at
# the encoder: no pooler hop on the path every short query takes.
ACTIVATE = "activate"
# The tokenizer stage called on its own (vLLM's /tokenize, /detokenize): request parameter "mode".
TOKENIZE, DETOKENIZE, PIECES = "tokenize", "detokenize", "pieces"
DETOKENIZED = "DETOKENIZED"  # BYTES [n, 1], the text of each row of ids (mode detokenize)
# BYTES [n, 1], mode pieces: each text's tokens with their strings and spans (contract.requests.TokenPieces)
TOKEN_PIECES = "TOKEN_PIECES"

# ---- scoring (<name>_score) ---------------------------------------------------------------------------
QUERY, DOCUMENTS, SCORES = "QUERY", "DOCUMENTS", "SCORES"  # BYTES [q], BYTES [d] -> FP32 [d]
BI_ENCODER, LATE_INTERACTION, CROSS_ENCODER = "bi-encoder", "late-interaction", "cross-encoder"

# ---- images (<name>_image: IMAGE -> EMBEDDING; its stages <name>_image_processor, <name>_image_encoder) --
IMAGE = "IMAGE"  # BYTES [n, 1]: encoded images (PNG, JPEG, WebP, GIF, BMP, TIFF)
PIXEL_VALUES = "pixel_values"  # FP32 [n, 3, H, W]: the image processor's output, the vision tower's input

# ---- plugins --------------------------------------------------------------------------------------------
PLUGIN_INPUT, PLUGIN_OUTPUT = "INPUT", "OUTPUT"  # BYTES [n] -> BYTES [n] (JSON per item)


# Model names become folder names in the repository and names in URLs: letters, digits, '_', '-' and
# '.', starting with a letter or digit, no '..' (nothing that could leave the repository folder).
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Plugin modules are imported inside Triton: a dotted Python module name, nothing else.
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def invalid_model_name(name: str) -> str | None:
    """Why `name` cannot be a model name (None: it can)."""
    if not _MODEL_NAME.fullmatch(name) or ".." in name:
        return (f"invalid model name {name!r}: use letters, digits, '_', '-' and '.' (at most 128, starting "
                "with a letter or digit, no '..')")
    return None


def invalid_module_name(module: str) -> str | None:
    if not _MODULE_NAME.fullmatch(module):
        return f"invalid plugin module {module!r}: a dotted Python module name (e.g. my_pkg.plugins)"
    return None


@dataclass(frozen=True)
class Stages:
    """The models one export writes: the public ensemble and the stages it chains."""

    ensemble: str
    tokenizer: str
    encoder: str
    pooler: str
    score: str

    def __iter__(self):
        return iter((self.ensemble, self.tokenizer, self.encoder, self.pooler, self.score))


def stages(name: str) -> Stages:
    return Stages(name, f"{name}_tokenizer", f"{name}_encoder", f"{name}_pooler", f"{name}_score")


@dataclass(frozen=True)
class ImageStages:
    """The models an image tower's export writes: the public image ensemble and the stages it chains."""

    ensemble: str
    processor: str
    encoder: str

    def __iter__(self):
        return iter((self.ensemble, self.processor, self.encoder))


def image_stages(name: str) -> ImageStages:
    return ImageStages(f"{name}_image", f"{name}_image_processor", f"{name}_image_encoder")


def triton_priority(priority: int, short: bool = False) -> int:
    """vLLM's priority (lower runs earlier, 0 default) -> Triton's levels (1 highest of PRIORITY_LEVELS,
    0 = the default level); a `short` request (contract.admission.SHORT_TOKENS) at the default runs at
    PRIORITY_SHORT."""
    if priority == 0:
        return PRIORITY_SHORT if short else 0
    return 1 if priority < 0 else PRIORITY_LEVELS
