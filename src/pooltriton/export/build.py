"""Export one Hugging Face model into a Triton model repository.

Layout (it mirrors the data flow, like a sentence-transformers folder mirrors its modules):

    <out>/<name>/              ensemble: TEXT (+ optional TEXT_PAIR) -> the task's output;
                               pooler_config.json = the resolved configuration
    <out>/<name>_tokenizer/    backend "tokenizer"; 1/tokenizer.json
    <out>/<name>_encoder/      backend "onnxruntime" (1/model.onnx) or "pytorch" (1/model.pt), pooling
                               (and head) inside, and for embed the normalisation (ACTIVATE, per text);
                               verification.json = measured error vs the user's library
    <out>/<name>_pooler/       backend "pooler" (not for embed): activation, and real-token selection
                               for token tasks
    <out>/<name>_score/        backend "scorer" (only for models that can score): bi-encoder cosine,
                               late-interaction MaxSim or cross-encoder, over QUERY / DOCUMENTS
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pooltriton.contract import (
    ACTIVATE,
    ATTENTION_MASK,
    BI_ENCODER,
    CROSS_ENCODER,
    DETOKENIZED,
    DOCUMENTS,
    ENCODER_OUTPUT,
    ENCODER_THREADS,
    INPUT_IDS,
    LATE_INTERACTION,
    MAX_BATCH_SIZE,
    OUTPUT_NAMES,
    PROMPT_TOKENS,
    QUERY,
    QUEUE_SIZE,
    QUEUE_TIMEOUT_MS,
    SCORES,
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNTS,
    TOKEN_PIECES,
    TOKENIZER_INSTANCES,
    Stages,
    image_stages,
    invalid_model_name,
    stages,
)
from pooltriton.contract.config import (
    Accelerator,
    DynamicBatching,
    EnsembleStep,
    ModelConfig,
    QueuePolicy,
    Tensor,
    caller_queue,
    stage_batching,
)
from pooltriton.contract.parameters import (
    EncoderParameters,
    EnsembleParameters,
    PoolerParameters,
    ScorerParameters,
    TokenizerParameters,
)
from pooltriton.core.capabilities import AUTO, Capabilities, PrecisionError, choose_precision, detect
from pooltriton.core.resolve import (
    FP16_OVERFLOW_MODEL_TYPES,
    MULTIMODAL_MODEL_TYPES,
    STATIC_EMBEDDING,
    PoolerConfig,
    ResolutionError,
    read_json,
    resolve,
)
from pooltriton.core.runtimes import CPU, CUDA, FP16, FP32, INT8, RUNTIMES, TOLERANCES, Runtime
from pooltriton.core.semantics import PoolingType, Task
from pooltriton.export.publish import publish, staging_folder, write_json
from pooltriton.export.refusals import check_architecture, check_model_files, check_supported, multimodal_refusal

# Used when batching="buckets": the tokenizer pads to these lengths so that equal shapes meet in
# Triton's dynamic batcher (needed by native backends, which cannot take ragged [B, L] inputs).
BUCKETS = (16, 32, 64, 128, 256, 512)
# Rows x padded length per encoder call in the ragged shims. On CPU, measured on MiniLM (2 cores):
# ONNX Runtime runs ~20 % faster at 4-16 rows of ~130 tokens than at 64 (activations stay in cache),
# so chunks stay small (docs/performance.md); a GPU wants big launches.
RAGGED_TOKEN_BUDGET = {CPU: 2048, CUDA: 32768}
# fp32 keeps the exported answers; 1 GiB workspace is the onnxruntime backend's documented example.
TENSORRT = Accelerator("tensorrt", {"precision_mode": "FP32", "max_workspace_size_bytes": str(1 << 30)})


@dataclass(frozen=True)
class ExportOptions:
    name: str
    out: Path
    task: str | None = None
    pooling_type: str | None = None
    use_activation: bool | None = None
    max_length: int | None = None
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    convert: str | None = None
    matryoshka_dimensions: tuple[int, ...] = ()  # sizes the embedding may be cut to (then re-normalised)
    runtime: str = "onnx"  # or "openvino", "torchscript" (pooltriton.core.runtimes.RUNTIMES)
    # "fp32", "bf16" (openvino, torchscript), "fp16" (torchscript, for GPUs), "int8" (openvino, embedding
    # models, CPUs with VNNI/AMX: export.quantize) or "auto": what this machine runs natively
    # (pooltriton.core.capabilities); fp32 stays the default, the exact reference.
    precision: str = FP32
    device: str = "cpu"  # or "cuda": KIND_GPU encoder instances (torchscript)
    batching: str = "ragged"  # or "buckets" (native backends: they cannot take ragged inputs)
    tensorrt: bool = False  # onnx on cuda: TensorRT as the onnxruntime backend's GPU accelerator
    encoder_threads: int = ENCODER_THREADS
    tokenizer_instances: int = TOKENIZER_INSTANCES  # (why two: contract)
    ragged_token_budget: int | None = None  # None: RAGGED_TOKEN_BUDGET of the device
    # Memory the ragged encoder may hold at once (export.memory's model of a row), shared by its instances
    # and streams; 0: half of the serving machine's. A text that alone needs more than its share is refused.
    memory_budget_mb: int = 0
    tolerance: float | None = None  # verification bound; None: the precision's default (export.verify)
    queue_size: int = QUEUE_SIZE  # waiting requests per batched stage before rejecting at once
    queue_timeout_ms: int = QUEUE_TIMEOUT_MS  # a request still waiting after this is rejected
    allow_pickle: bool = False  # load pickled weights (pytorch_model.bin): they can run code when loaded
    trust_remote_code: bool = False  # models whose config.json names custom code (auto_map)
    # A causal LM as a reranker: the (no, yes) tokens whose LM-head rows make its one logit, and the text
    # each (query, document) pair is scored as ({query} and {document} replaced).
    classifier_from_tokens: tuple[str, ...] | None = None
    score_template: str | None = None
    served_model_names: tuple[str, ...] = ()  # other names clients may use (vLLM's --served-model-name)

    def check(self, capabilities: Capabilities, quantize: bool = True) -> tuple[Runtime, ExportOptions]:
        """The runtime, and these options with the precision decided (`auto`; int8 only if `quantize`) and
        checked against the CPU."""
        for name in (self.name, *self.served_model_names):
            if (problem := invalid_model_name(name)) is not None:
                raise ResolutionError(problem)
        if set(self.served_model_names) & set(stages(self.name)) or \
                len(set(self.served_model_names)) < len(self.served_model_names):
            raise ResolutionError("--served-model-name: each name once, and not the model's own --name or one of "
                                  "its stages' (<name>_tokenizer, _encoder, _pooler, _score)")
        runtime = RUNTIMES.get(self.runtime)
        if runtime is None:
            raise ResolutionError(f"runtime must be one of {sorted(RUNTIMES)}, not {self.runtime!r}")
        try:
            precision, reason = choose_precision(self.runtime, self.precision, self.device, capabilities, quantize)
        except PrecisionError as error:
            raise ResolutionError(str(error)) from None
        if self.memory_budget_mb < 0:
            raise ResolutionError("--memory-budget-mb must be 0 (half the machine's memory) or positive")
        if self.queue_size < 1 or self.queue_timeout_ms < 1 or self.tokenizer_instances < 1:
            raise ResolutionError("--queue-size, --queue-timeout-ms and --tokenizer-instances must be positive")
        if self.tolerance is not None and not 0 < self.tolerance < 1:
            raise ResolutionError(f"--tolerance must be between 0 and 1, not {self.tolerance}")
        if self.precision == AUTO:
            print(f"--precision auto: {precision} ({reason})", file=sys.stderr)
        if precision not in runtime.precisions:
            raise ResolutionError(f"the {self.runtime} runtime serves {'/'.join(runtime.precisions)}, "
                                  f"not {precision}")
        if self.device not in runtime.devices:
            raise ResolutionError(f"the {self.runtime} runtime runs on {'/'.join(runtime.devices)}, "
                                  f"not {self.device}")
        if self.tensorrt and (self.runtime, self.device) != ("onnx", CUDA):
            raise ResolutionError("--tensorrt is an accelerator of the onnx runtime on cuda")
        if self.classifier_from_tokens is not None and len(self.classifier_from_tokens) not in (1, 2):
            raise ResolutionError("--classifier-from-tokens takes one token (YES) or two (NO,YES)")
        if self.score_template is not None and not all(k in self.score_template for k in ("{query}", "{document}")):
            raise ResolutionError("--score-template must contain {query} and {document}")
        return runtime, replace(self, precision=precision)


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.step, self.started = total, 0, time.monotonic()

    def __call__(self, message: str) -> None:
        self.step += 1
        elapsed = time.monotonic() - self.started
        print(f"[{self.step}/{self.total} {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def resolve_options(model_dir: Path, options: ExportOptions) -> PoolerConfig:
    return resolve(
        model_dir, task=options.task, pooling_type=options.pooling_type, use_activation=options.use_activation,
        max_length=options.max_length, step_tag_id=options.step_tag_id,
        returned_token_ids=options.returned_token_ids, convert=options.convert,
        classifier_tokens=classifier_tokens(model_dir, options.classifier_from_tokens),
    )


def classifier_tokens(model_dir: Path, tokens: tuple[str, ...] | None) -> tuple[tuple[str, int], ...] | None:
    """(token, id) for each of the (no, yes) or (yes,) tokens, from the model's own tokenizer; each must be one
    token."""
    if tokens is None:
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    found = []
    for token in tokens:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            ids = tokenizer.encode(token, add_special_tokens=False).ids
            if len(ids) != 1:
                raise ResolutionError(f"classifier token {token!r} is not one token of the model's vocabulary "
                                      f"(it encodes to {ids})")
            token_id = ids[0]
        found.append((token, int(token_id)))
    return tuple(found)


def export_model(model_dir: str | Path, options: ExportOptions) -> dict:
    from pooltriton.export.view import transformers_view

    model_dir = Path(model_dir)
    with transformers_view(model_dir) as folder:  # code transformers ports read as the port (core.resolve)
        try:
            return _export_model(folder, options)
        except ResolutionError as error:  # named by the user's folder, not the view's
            if folder == model_dir:
                raise
            raise ResolutionError(str(error).replace(str(folder), str(model_dir))) from None


def _export_model(model_dir: Path, options: ExportOptions) -> dict:
    # Heavy imports here, so `pooltriton inspect` and `--help` stay fast.
    from pooltriton.export.encoder import load_encoder, output_width
    from pooltriton.export.memory import encoder_memory
    from pooltriton.export.tokens import served_tokenizer
    from pooltriton.export.verify import VerificationError
    from pooltriton.export.vision import read_layout

    hf = read_json(model_dir / "config.json") or {}
    layout = read_layout(model_dir)
    if layout is not None or hf.get("model_type") in MULTIMODAL_MODEL_TYPES or hf.get("vision_config"):
        return _export_image_model(model_dir, options, hf, layout)
    requested = options
    runtime, options = options.check(detect())
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ResolutionError(f"{model_dir} has no tokenizer.json (a fast tokenizer is required)")
    check_model_files(model_dir, hf, options.allow_pickle, options.trust_remote_code)
    check_architecture(model_dir, hf)
    progress = Progress(6 if options.precision == INT8 else 5)
    progress(f"resolving pooler configuration of {model_dir}")
    config = resolve_options(model_dir, options)
    check_supported(config)
    options = without_fp16_overflow(config, options, requested.precision)
    runtime, options = static_precision(config, runtime, options, requested)
    if options.precision == INT8 and config.task is not Task.EMBED:
        if requested.precision != AUTO:
            raise ResolutionError(f"--precision int8 serves embedding models (its bounds are cosine and "
                                  f"retrieval neighbours), not {config.task.value}")
        runtime, options = _auto_without_int8(requested, "int8 serves embedding models only")
    # Verification feeds both sides the same ids: the library's own tokenizer is served, checked here first.
    tokenizer = served_tokenizer(model_dir, config, options.trust_remote_code)
    progress(f"loading {config.architecture} ({config.task.value}, {config.pooling_type.value} pooling)")
    encoder = load_encoder(model_dir, config, options.allow_pickle, options.trust_remote_code)
    width = output_width(encoder, config)
    check_matryoshka(options, config, width)  # before minutes of export, not after
    out = Path(options.out)
    names = stages(options.name)
    # Everything is written beside the repository first and moved in only once verified and complete: a
    # failed (re-)export leaves the model that was there, and a server never finds half of one.
    staging = staging_folder(out, options.name)
    try:
        try:
            report = _export_encoder(model_dir, encoder, config, tokenizer, options, runtime, progress, staging)
        except VerificationError as error:
            if not (requested.precision == AUTO and options.precision == INT8):
                raise
            runtime, options = _auto_without_int8(requested, f"int8 missed its bounds: {error}")
            report = _export_encoder(model_dir, encoder, config, tokenizer, options, runtime, progress, staging)
        print(report.table(), file=sys.stderr)
        progress(f"writing model configurations under {out}")
        for model in pipeline_configs(options, config, encoder.input_names, ENCODER_OUTPUT, width,
                                      tokenizer.pad_token_id, encoder_memory(model_dir, config.pooling_type.sparse),
                                      chat=(tokenizer.chat_template, tokenizer.chat_tokens)):
            model.write(staging)
        _write_text_files(staging, names, tokenizer.text, report, config)
        publish(staging, out, names)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"exported {options.name} ({options.runtime}, {options.precision}) to {out}", file=sys.stderr)
    return asdict(report)


def _export_image_model(model_dir: Path, options: ExportOptions, hf: dict, layout) -> dict:
    """An image-text dual encoder (CLIP, SigLIP): its image tower as `<name>_image` (export.vision) and its
    text tower as the text pipeline `<name>` (export.text_tower), each verified against transformers."""
    from pooltriton.export.text_tower import tower_config
    from pooltriton.export.vision import export_image_tower

    if layout is None:
        raise ResolutionError(multimodal_refusal(hf))
    hf = read_json(layout.tower / "config.json") or {}
    if options.precision == AUTO:  # towers are verified in fp32 (fp16 TorchScript on a GPU)
        fp16 = (options.runtime, options.device) == ("torchscript", CUDA)
        options = replace(options, precision=FP16 if fp16 else FP32)
        print(f"--precision auto: {options.precision} (image-text towers)", file=sys.stderr)
    runtime, options = options.check(detect())
    check_model_files(layout.tower, hf, options.allow_pickle, options.trust_remote_code)
    if hf.get("auto_map"):
        raise ResolutionError(f"{model_dir} names custom code (auto_map): image-text models are served from "
                              "transformers' own CLIPModel / SiglipModel only")
    config = tower_config(layout.tower, hf, layout.normalize)
    progress = Progress(4 if config is None else 7)
    out = Path(options.out)
    staging = staging_folder(out, options.name)
    text = options.name if config is not None else None
    try:
        report = {"image": asdict(export_image_tower(layout, options, hf, progress, staging, text_model=text))}
        if config is not None:
            report["text"] = asdict(_export_text_tower(layout.tower, options, config, runtime, progress, staging))
        progress(f"writing model configurations under {out}")
        publish(staging, out, [*(stages(options.name) if config is not None else ()), *image_stages(options.name)])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    towers = "image and text towers" if config is not None else "image tower (no tokenizer.json: no text tower)"
    print(f"exported {options.name}'s {towers} ({options.runtime}, {options.precision}) to {out}", file=sys.stderr)
    return report


def _export_text_tower(model_dir: Path, options: ExportOptions, config: PoolerConfig, runtime: Runtime,
                       progress: Progress, staging: Path):
    from pooltriton.export import text_tower
    from pooltriton.export.encoder import DTYPES, export_onnx
    from pooltriton.export.memory import encoder_memory
    from pooltriton.export.tokens import served_tokenizer
    from pooltriton.export.verify import exporter, verify

    names = stages(options.name)
    tokenizer = served_tokenizer(model_dir, config)
    progress(f"loading {config.architecture}'s text tower (max {config.max_length} tokens)")
    tower = text_tower.load_tower(model_dir, config.model_type, options.allow_pickle)
    artefact = staging / names.encoder / "1" / runtime.filename
    progress(f"exporting the {options.runtime} text encoder to {Path(options.out) / names.encoder / '1'}")
    if options.runtime == "onnx":
        export_onnx(tower, artefact, config.max_length)
    else:
        text_tower.export_torchscript(tower.to(DTYPES[options.precision]), artefact, options.device)
    progress("verifying the text encoder against transformers' get_text_features")
    report = verify(text_tower.reference(model_dir, config.model_type, options.allow_pickle),
                    exporter(options.runtime)[1](artefact, options.precision, options.device), tokenizer, config,
                    tower.input_names, runtime=runtime.backend, precision=options.precision,
                    tolerance=options.tolerance)
    print(report.table(), file=sys.stderr)
    width = _tower_width(tower, options.device)
    models = pipeline_configs(options, config, tower.input_names, ENCODER_OUTPUT, width, tokenizer.pad_token_id,
                              encoder_memory(model_dir))
    for model in models:
        if model.name == names.ensemble:
            model.parameters["image_model"] = image_stages(options.name).ensemble
    if not text_tower.TOWERS[config.model_type][1]:
        text_tower.padded_to_length(models, names.tokenizer, config.max_length)
    for model in models:
        model.write(staging)
    _write_text_files(staging, names, tokenizer.text, report, config)
    return report


def _write_text_files(staging: Path, names: Stages, tokenizer_json: str, report, config: PoolerConfig) -> None:
    """What a text pipeline carries beside its configs: the tokenizer, the read-back report, the resolution."""
    (staging / names.tokenizer / "1" / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    write_json(staging / names.encoder / "verification.json", asdict(report))
    write_json(staging / names.ensemble / "pooler_config.json", config.to_json())


def _tower_width(tower, device: str) -> int:
    import torch

    from pooltriton.export.encoder import sample_inputs

    with torch.no_grad():
        return int(tower(*sample_inputs(tower, device=device)).shape[-1])


def without_fp16_overflow(config: PoolerConfig, options: ExportOptions, requested: str) -> ExportOptions:
    """fp32 where auto chose fp16 for a family that overflows in it (T5); an explicit fp16 is refused."""
    if options.precision != FP16 or config.model_type not in FP16_OVERFLOW_MODEL_TYPES:
        return options
    if requested != AUTO:
        raise ResolutionError(f"{config.architecture} (model_type {config.model_type!r}) overflows in fp16 "
                              "(transformers keeps its feed-forward outputs in fp32); use --precision fp32 or bf16")
    print(f"--precision auto: fp32 ({config.model_type} overflows in fp16)", file=sys.stderr)
    return replace(options, precision=FP32)


def static_precision(config: PoolerConfig, runtime: Runtime, options: ExportOptions,
                     requested: ExportOptions) -> tuple[Runtime, ExportOptions]:
    """A StaticEmbedding computes no products (a table lookup and a mean): int8 would only round its table,
    and auto keeps fp32, which lower precisions make no faster."""
    if config.model_type != STATIC_EMBEDDING or options.precision == FP32:
        return runtime, options
    if requested.precision == INT8:
        raise ResolutionError("--precision int8 quantizes matrix products, and a StaticEmbedding has none (it "
                              "averages rows of its table): use fp32")
    if requested.precision != AUTO:
        return runtime, options
    print("--precision auto: fp32 (a StaticEmbedding computes no products that a lower precision would speed up)",
          file=sys.stderr)
    return runtime, replace(options, precision=FP32)


def _auto_without_int8(requested: ExportOptions, reason: str) -> tuple[Runtime, ExportOptions]:
    """`auto`'s next choice once int8 is out for this model (the one place it falls back)."""
    runtime, options = requested.check(detect(), quantize=False)
    print(f"--precision auto: {options.precision} ({reason})", file=sys.stderr)
    return runtime, options


def _export_encoder(model_dir: Path, encoder, config: PoolerConfig, tokenizer, options: ExportOptions,
                    runtime: Runtime, progress: Progress, out: Path):
    """Export the encoder into its stage's version folder under `out` (the staging folder) and verify it
    against the user's library; a failure leaves nothing of it there."""
    from pooltriton.export.reference import load_reference
    from pooltriton.export.verify import VerificationError, exporter, verify

    names = stages(options.name)
    shutil.rmtree(out / names.encoder, ignore_errors=True)  # int8's attempt, before auto's next precision
    version = out / names.encoder / "1"
    artefact = version / runtime.artefact(options.precision)
    progress(f"exporting {options.runtime} encoder ({options.precision}, {options.device}) to "
             f"{Path(options.out) / artefact.relative_to(out)}")
    export, runner = exporter(options.runtime)
    # ONNX stays fp32 (OpenVINO lowers the precision when it compiles, NNCF quantizes it for int8);
    # TorchScript is traced in the serving precision on the serving device.
    lowered = options.runtime == "torchscript" and (options.precision, options.device) != (FP32, CPU)
    traced = copy.deepcopy(encoder).to_precision(options.precision, options.device) if lowered else encoder
    exported = version / runtime.filename
    try:
        _export_or_restore(export, traced, config, exported, options)
        del traced
        quantization = None
        if options.precision == INT8:
            from pooltriton.export.corpus import corpus
            from pooltriton.export.quantize import quantize_openvino

            texts = corpus()
            progress(f"quantizing to int8 (NNCF int8 weights, activations at run time; accuracy control on "
                     f"{texts.source})")
            quantization = quantize_openvino(exported, artefact, tokenizer, encoder.input_names, texts,
                                             options.tolerance or TOLERANCES[INT8])
            exported.unlink()
        reference = load_reference(model_dir, config, options.allow_pickle, options.trust_remote_code)
        progress(f"verifying the {options.runtime} encoder against {reference.description}")
        report = verify(reference, runner(artefact, options.precision, options.device), tokenizer, config,
                        encoder.input_names, runtime=runtime.backend, precision=options.precision,
                        tolerance=options.tolerance)
        report.quantization = quantization.summary() if quantization else None
        return report
    except BaseException as error:
        shutil.rmtree(out / names.encoder, ignore_errors=True)
        if isinstance(error, VerificationError) and error.report is not None:
            print(error.report.table(), file=sys.stderr)
        raise


def _export_or_restore(export, encoder, config: PoolerConfig, exported: Path, options: ExportOptions) -> None:
    """Trace `encoder` into `exported`, or copy the same graph traced before (export.graphs: ONNX only,
    where tracing costs ~10 s and more; a TorchScript trace takes ~1 s)."""
    from pooltriton.export import graphs

    key = None
    if options.runtime != "torchscript" and graphs.cache_dir() is not None:
        key = graphs.graph_key(encoder, config, exported.name)
        if graphs.restore(key, exported):
            return
    export(encoder, exported, config.max_length, options.device)
    if key is not None:
        graphs.store(key, exported)


def score_mode(config: PoolerConfig) -> str | None:
    """Which scoring a model enables (vLLM: only 1-label classifiers are cross-encoders)."""
    if config.task is Task.EMBED:
        return BI_ENCODER
    if config.task is Task.TOKEN_EMBED and config.pooling_type is PoolingType.ALL:
        return LATE_INTERACTION
    if config.task is Task.CLASSIFY and config.num_labels == 1:
        return CROSS_ENCODER
    return None


@dataclass(frozen=True)
class _Tensors:
    """The tensors the stages of one pipeline pass each other."""

    text_inputs: list[Tensor]
    token_outputs: list[str]  # what the tokenizer hands the encoder (and the pooler of a token task)
    encoder_inputs: tuple[str, ...]
    pooled: Tensor  # the encoder's output
    pooler_extra: list[str]  # the pooler of a token task needs the mask (real tokens) and the ids (STEP tags)
    output: Tensor
    public_outputs: list[Tensor]
    prompt_tokens: Tensor


def check_matryoshka(options: ExportOptions, config: PoolerConfig, width: int) -> None:
    if options.matryoshka_dimensions and config.pooling_type.sparse:
        raise ResolutionError("Matryoshka dimensions cut an embedding's first entries; a SPLADE vector's entries "
                              "are the vocabulary's, so none can be cut")
    if options.matryoshka_dimensions and (not config.task.is_embedding
                                          or any(not 0 < d < width for d in options.matryoshka_dimensions)):
        raise ResolutionError(f"Matryoshka dimensions must be below the embedding width {width}, for embed tasks")


def pipeline_configs(
    options: ExportOptions,
    config: PoolerConfig,
    encoder_inputs: tuple[str, ...],
    encoder_output: str,
    width: int,
    pad_token_id: int,
    memory: tuple[int, int],  # bytes per token and per attention cell of a row (export.memory)
    chat: tuple[str | None, dict[str, str] | None] = (None, None),  # chat template and its special tokens
) -> list[ModelConfig]:
    """tokenizer -> encoder -> pooler behind one ensemble, and a scorer where the model can score."""
    per_token = config.task.per_token
    check_matryoshka(options, config, width)
    pooler_extra = [n for n in (ATTENTION_MASK, INPUT_IDS) if per_token]
    output = Tensor(OUTPUT_NAMES[config.task], "TYPE_FP32", (width,))
    tensors = _Tensors(
        text_inputs=[Tensor(TEXT, "TYPE_STRING", (1,)), Tensor(TEXT_PAIR, "TYPE_STRING", (1,), optional=True)],
        token_outputs=list(dict.fromkeys([*encoder_inputs, *pooler_extra])), encoder_inputs=encoder_inputs,
        pooled=Tensor(encoder_output, "TYPE_FP32", (-1, width) if per_token else (width,)),
        pooler_extra=pooler_extra, output=output,
        public_outputs=[output] + ([Tensor(TOKEN_COUNTS, "TYPE_INT64", (1,))] if per_token else []),
        prompt_tokens=Tensor(PROMPT_TOKENS, "TYPE_INT64", (1,)))
    names = stages(options.name)
    queue = QueuePolicy(options.queue_size, options.queue_timeout_ms * 1000)
    models = [_tokenizer_config(names.tokenizer, options, config, tensors, pad_token_id, queue),
              _encoder_config(names.encoder, options, config, tensors, pad_token_id, memory, queue),
              _ensemble_config(names, options, config, tensors, chat)]
    if not _activates_in_graph(tensors):
        models.insert(2, ModelConfig(name=names.pooler, backend="pooler", max_batch_size=MAX_BATCH_SIZE,
                          inputs=[tensors.pooled] + [Tensor(n, "TYPE_INT64", (-1,)) for n in pooler_extra],
                          outputs=tensors.public_outputs,
                          dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0, queue=queue),
                          parameters=PoolerParameters(
                              task=config.task.value, activation=config.activation.value,
                              use_activation=config.use_activation,
                              step_tag_id=config.step_tag_id if config.pooling_type is PoolingType.STEP else None,
                              drop_first=config.drop_first, drop_last=config.drop_last,
                          ).to_parameters()))
    mode = score_mode(config)
    if mode is not None:
        models.append(ModelConfig(
            name=names.score, backend="scorer", max_batch_size=0,
            inputs=[Tensor(QUERY, "TYPE_STRING", (-1,)), Tensor(DOCUMENTS, "TYPE_STRING", (-1,))],
            outputs=[Tensor(SCORES, "TYPE_FP32", (-1,)), tensors.prompt_tokens],
            instance_count=2,  # scoring waits on the ensemble it calls; two let requests overlap
            dynamic_batching=caller_queue(options.queue_size),
            parameters=ScorerParameters(mode=mode, model=names.ensemble, output=output.name,
                                        template=options.score_template).to_parameters(),
        ))
    return models


def _activates_in_graph(tensors: _Tensors) -> bool:
    """An embed encoder normalises in its graph (ACTIVATE): its ensemble ends there, with no pooler."""
    return ACTIVATE in tensors.encoder_inputs


def _token_tensor(name: str, ragged: bool = False) -> Tensor:
    """A tensor the tokenizer hands the encoder: one value per token, or ACTIVATE's one per text."""
    return Tensor(name, "TYPE_INT64", (1,) if name == ACTIVATE else (-1,), allow_ragged_batch=ragged)


def _tokenizer_config(name: str, options: ExportOptions, config: PoolerConfig, tensors: _Tensors,
                      pad_token_id: int, queue: QueuePolicy) -> ModelConfig:
    ragged = options.batching == "ragged"
    parameters = TokenizerParameters(
        max_length=config.max_length, pad_token_id=pad_token_id, outputs=tuple(tensors.token_outputs),
        pad_to_buckets=None if ragged else (*(b for b in BUCKETS if b < config.max_length), config.max_length),
        prompts=dict(config.prompts), default_prompt_name=config.default_prompt_name if config.prompts else None,
        use_activation=config.use_activation, encoder=stages(options.name).encoder)
    return ModelConfig(
        name=name, backend="tokenizer", max_batch_size=MAX_BATCH_SIZE, inputs=tensors.text_inputs,
        outputs=[*(_token_tensor(n) for n in tensors.token_outputs), tensors.prompt_tokens,
                 Tensor(DETOKENIZED, "TYPE_STRING", (1,)), Tensor(TOKEN_PIECES, "TYPE_STRING", (1,))],
        dynamic_batching=stage_batching(queue),  # no delay, the priority levels
        instance_count=options.tokenizer_instances,
        parameters=parameters.to_parameters(),
    )


def _encoder_config(name: str, options: ExportOptions, config: PoolerConfig, tensors: _Tensors, pad_token_id: int,
                    memory: tuple[int, int], queue: QueuePolicy) -> ModelConfig:
    runtime = RUNTIMES[options.runtime]
    ragged = options.batching == "ragged"
    batching = ({"ragged_token_budget": options.ragged_token_budget or RAGGED_TOKEN_BUDGET[options.device],
                 "memory_per_token": memory[0], "memory_per_attention_cell": memory[1],
                 "memory_budget": options.memory_budget_mb << 20} if ragged else {})
    parameters = EncoderParameters(pad_token_id=pad_token_id, max_length=config.max_length,
                                   precision=options.precision, **batching)
    return ModelConfig(
        name=name, backend=runtime.backend, default_model_filename=runtime.artefact(options.precision),
        max_batch_size=MAX_BATCH_SIZE,
        inputs=[_token_tensor(n, ragged) for n in tensors.encoder_inputs],
        outputs=[tensors.pooled],
        dynamic_batching=stage_batching(queue),
        instance_kind="KIND_GPU" if options.device == CUDA else "KIND_CPU",
        gpu_accelerators=[TENSORRT] if options.tensorrt else [],
        # The native backends' own keys, so the config means the same on both servers.
        parameters={**runtime.parameters(options.encoder_threads, options.precision), **parameters.to_parameters()},
    )


def _ensemble_config(names: Stages, options: ExportOptions, config: PoolerConfig, tensors: _Tensors,
                     chat: tuple[str | None, dict[str, str] | None]) -> ModelConfig:
    parameters = EnsembleParameters(
        task=config.task.value, max_length=config.max_length, labels=tuple(config.labels) if config.labels else None,
        matryoshka_dimensions=tuple(sorted(options.matryoshka_dimensions)) or None,
        use_activation=config.use_activation, prompts=tuple(config.prompts) or None,
        sparse=config.pooling_type.sparse or None, pooling=config.pooling_type.value, precision=options.precision,
        token_weights=(config.task is Task.TOKEN_CLASSIFY and config.token_head is not None) or None,
        served_names=tuple(options.served_model_names) or None, chat_template=chat[0], chat_tokens=chat[1])
    encoder_output = tensors.pooled.name
    steps = [EnsembleStep(names.tokenizer, {TEXT: TEXT, TEXT_PAIR: TEXT_PAIR},
                          {n: n for n in (*tensors.token_outputs, PROMPT_TOKENS)})]
    if _activates_in_graph(tensors):
        steps.append(EnsembleStep(names.encoder, {n: n for n in tensors.encoder_inputs},
                                  {encoder_output: tensors.output.name}))
    else:
        steps += [EnsembleStep(names.encoder, {n: n for n in tensors.encoder_inputs}, {encoder_output: encoder_output}),
                  EnsembleStep(names.pooler, {n: n for n in (encoder_output, *tensors.pooler_extra)},
                               {t.name: t.name for t in tensors.public_outputs})]
    return ModelConfig(
        name=names.ensemble, platform="ensemble", max_batch_size=MAX_BATCH_SIZE, inputs=tensors.text_inputs,
        outputs=[*tensors.public_outputs, tensors.prompt_tokens], parameters=parameters.to_parameters(),
        ensemble_steps=steps)
