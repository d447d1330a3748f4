"""Export one Hugging Face model into a Triton model repository.

Layout (it mirrors the data flow, like a sentence-transformers folder mirrors its modules):

    <out>/<name>/              ensemble: TEXT -> EMBEDDING; pooler_config.json = the resolved config
    <out>/<name>_tokenizer/    backend "tokenizer"; 1/tokenizer.json
    <out>/<name>_encoder/      backend "onnxruntime"; 1/model.onnx (pooling inside); verification.json
    <out>/<name>_pooler/       backend "pooler" (activation: normalize / softmax / sigmoid)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pooltriton.repository import DynamicBatching, EnsembleStep, ModelConfig, Tensor
from pooltriton.resolve import PoolerConfig, resolve
from pooltriton.semantics import Task

MAX_BATCH_SIZE = 128
# Used when batching="buckets": the tokenizer pads to these lengths so that equal shapes meet in
# Triton's dynamic batcher (needed by native backends, which cannot take ragged [B, L] inputs).
BUCKETS = (16, 32, 64, 128, 256, 512)
OUTPUT_NAMES = {Task.EMBED: "EMBEDDING", Task.CLASSIFY: "PROBABILITIES",
                Task.TOKEN_EMBED: "TOKEN_EMBEDDINGS", Task.TOKEN_CLASSIFY: "TOKEN_PROBABILITIES"}


@dataclass(frozen=True)
class ExportOptions:
    name: str
    out: Path
    task: str | None = None
    pooling_type: str | None = None
    use_activation: bool | None = None
    max_length: int | None = None
    batching: str = "ragged"  # or "buckets"
    encoder_threads: int = 2


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.step, self.started = total, 0, time.monotonic()

    def __call__(self, message: str) -> None:
        self.step += 1
        elapsed = time.monotonic() - self.started
        print(f"[{self.step}/{self.total} {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def export_model(model_dir: str | Path, options: ExportOptions) -> dict:
    # Heavy imports here, so `pooltriton inspect` and `--help` stay fast.
    from pooltriton.export.encoder import ENCODER_OUTPUT, export_onnx, load_encoder
    from pooltriton.export.verify import onnx_runner, verify
    from pooltriton.tokenization import TextTokenizer

    model_dir = Path(model_dir)
    progress = Progress(5)
    progress(f"resolving pooler configuration of {model_dir}")
    config = resolve(
        model_dir,
        task=options.task,
        pooling_type=options.pooling_type,
        use_activation=options.use_activation,
        max_length=options.max_length,
    )
    progress(f"loading {config.architecture} ({config.task.value}, {config.pooling_type.value} pooling)")
    encoder = load_encoder(model_dir, config)
    hidden = encoder.model.config.hidden_size

    out = Path(options.out)
    names = stage_names(options.name)
    for stage in names.values():
        shutil.rmtree(out / stage, ignore_errors=True)
    encoder_dir = out / names["encoder"]
    onnx_path = encoder_dir / "1" / "model.onnx"
    progress(f"exporting ONNX encoder to {onnx_path}")
    export_onnx(encoder, onnx_path, config.max_length)

    progress("verifying the ONNX encoder against PyTorch")
    tokenizer_file = model_dir / "tokenizer.json"
    tokenizer = TextTokenizer(str(tokenizer_file), config.max_length)
    report = verify(encoder, onnx_runner(onnx_path), tokenizer, config, runtime="onnxruntime")

    progress(f"writing model configurations under {out}")
    for model in pipeline_configs(options, config, encoder.input_names, ENCODER_OUTPUT, hidden,
                                  tokenizer.pad_token_id):
        model.write(out)
    shutil.copy(tokenizer_file, out / names["tokenizer"] / "1" / "tokenizer.json")
    _write_json(encoder_dir / "verification.json", asdict(report))
    _write_json(out / names["ensemble"] / "pooler_config.json", config.to_json())
    print(
        f"exported {options.name}: max |Δ| vs PyTorch {report.max_abs_error_activated:.2e} "
        f"(tolerance {report.tolerance:g}), min cosine {report.min_cosine:.8f}",
        file=sys.stderr,
    )
    return asdict(report)


def stage_names(name: str) -> dict[str, str]:
    return {"ensemble": name, "tokenizer": f"{name}_tokenizer", "encoder": f"{name}_encoder",
            "pooler": f"{name}_pooler"}


def pipeline_configs(
    options: ExportOptions,
    config: PoolerConfig,
    encoder_inputs: tuple[str, ...],
    encoder_output: str,
    hidden: int,
    pad_token_id: int,
) -> list[ModelConfig]:
    names = stage_names(options.name)
    ragged = options.batching == "ragged"
    token_tensors = [Tensor(n, "TYPE_INT64", (-1,), allow_ragged_batch=ragged) for n in encoder_inputs]
    pooled = Tensor(encoder_output, "TYPE_FP32", (hidden,))
    output = Tensor(OUTPUT_NAMES[config.task], "TYPE_FP32", (hidden,))
    text = Tensor("TEXT", "TYPE_STRING", (1,))
    tokenizer_params = {
        "tokenizer_file": "tokenizer.json",
        "max_length": config.max_length,
        "pad_token_id": pad_token_id,
        "outputs": list(encoder_inputs),
    }
    if not ragged:
        tokenizer_params["pad_to_buckets"] = [b for b in BUCKETS if b < config.max_length] + [config.max_length]
    tokenizer = ModelConfig(
        name=names["tokenizer"], backend="tokenizer", max_batch_size=MAX_BATCH_SIZE,
        inputs=[text], outputs=[Tensor(n, "TYPE_INT64", (-1,)) for n in encoder_inputs],
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=500),
        parameters=tokenizer_params,
    )
    encoder = ModelConfig(
        name=names["encoder"], backend="onnxruntime", default_model_filename="model.onnx",
        max_batch_size=MAX_BATCH_SIZE, inputs=token_tensors, outputs=[pooled],
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=2000),
        # Same key as the native onnxruntime backend, so the config means the same on both servers.
        parameters={"intra_op_thread_count": str(options.encoder_threads), "pad_token_id": pad_token_id},
    )
    pooler = ModelConfig(
        name=names["pooler"], backend="pooler", max_batch_size=MAX_BATCH_SIZE,
        inputs=[pooled], outputs=[output],
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0),
        parameters={"activation": config.activation.value, "use_activation": config.use_activation},
    )
    ensemble = ModelConfig(
        name=names["ensemble"], platform="ensemble", max_batch_size=MAX_BATCH_SIZE,
        inputs=[text], outputs=[output],
        ensemble_steps=[
            EnsembleStep(names["tokenizer"], {"TEXT": "TEXT"}, {n: n for n in encoder_inputs}),
            EnsembleStep(names["encoder"], {n: n for n in encoder_inputs}, {encoder_output: encoder_output}),
            EnsembleStep(names["pooler"], {encoder_output: encoder_output}, {output.name: output.name}),
        ],
    )
    return [tokenizer, encoder, pooler, ensemble]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
