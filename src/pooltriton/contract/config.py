"""One typed description of a Triton model, rendered to `config.pbtxt`.

Every config in the generated repository comes from these dataclasses; there are no per-task
templates. The text format is protobuf text (model_config.proto); only the fields we use exist here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # TYPE_STRING, TYPE_INT64, TYPE_FP32, ...
    dims: tuple[int, ...]
    allow_ragged_batch: bool = False
    optional: bool = False


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's queue policy: at most `max_queue_size` waiting requests (more are rejected at once, as
    UNAVAILABLE / HTTP 503), each rejected if still waiting after `timeout_microseconds`; a request may
    ask for a shorter timeout (its "timeout" parameter)."""

    max_queue_size: int
    timeout_microseconds: int
    allow_timeout_override: bool = True


@dataclass(frozen=True)
class DynamicBatching:
    max_queue_delay_microseconds: int = 2000
    preferred_batch_size: tuple[int, ...] = ()
    priority_levels: int = 0
    queue: QueuePolicy | None = None


@dataclass(frozen=True)
class EnsembleStep:
    model_name: str
    input_map: dict[str, str]  # the step model's input name -> ensemble tensor name
    output_map: dict[str, str]  # the step model's output name -> ensemble tensor name


@dataclass(frozen=True)
class Accelerator:
    """A GPU execution accelerator of the native onnxruntime backend (e.g. TensorRT)."""

    name: str
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelConfig:
    name: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    backend: str | None = None  # "python"-based backends by their folder name, or onnxruntime/pytorch
    platform: str | None = None  # "ensemble"
    max_batch_size: int = 0
    dynamic_batching: DynamicBatching | None = None
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"
    parameters: dict[str, Any] = field(default_factory=dict)
    ensemble_steps: list[EnsembleStep] = field(default_factory=list)
    default_model_filename: str | None = None
    gpu_accelerators: list[Accelerator] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"name: {_q(self.name)}"]
        if self.platform:
            lines.append(f"platform: {_q(self.platform)}")
        if self.backend:
            lines.append(f"backend: {_q(self.backend)}")
        if self.default_model_filename:
            lines.append(f"default_model_filename: {_q(self.default_model_filename)}")
        lines.append(f"max_batch_size: {self.max_batch_size}")
        lines.append(_tensors("input", self.inputs))
        lines.append(_tensors("output", self.outputs))
        if self.dynamic_batching is not None:
            lines.append(_dynamic_batching(self.dynamic_batching))
        if self.platform != "ensemble":
            lines.append(
                f"instance_group [ {{ count: {self.instance_count} kind: {self.instance_kind} }} ]"
            )
        if self.gpu_accelerators:
            lines.append(_accelerators(self.gpu_accelerators))
        if self.parameters:
            lines.append(_parameters(self.parameters))
        if self.ensemble_steps:
            lines.append(_ensemble(self.ensemble_steps))
        return "\n".join(lines) + "\n"

    def write(self, repository: Path) -> Path:
        """Write `<repository>/<name>/config.pbtxt` and the version folder Triton requires."""
        model_dir = Path(repository) / self.name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        (model_dir / "config.pbtxt").write_text(self.render(), encoding="utf-8")
        return model_dir


def _accelerators(accelerators: list[Accelerator]) -> str:
    items = []
    for accelerator in accelerators:
        parameters = " ".join(f"parameters {{ key: {_q(k)} value: {_q(v)} }}"
                              for k, v in accelerator.parameters.items())
        items.append(f"{{ name: {_q(accelerator.name)} {parameters} }}")
    return f"optimization {{ execution_accelerators {{ gpu_execution_accelerator: [ {', '.join(items)} ] }} }}"


def _q(text: str) -> str:
    return json.dumps(text)


def _dims(dims: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _tensors(kind: str, tensors: list[Tensor]) -> str:
    blocks = []
    for tensor in tensors:
        parts = [f"name: {_q(tensor.name)}", f"data_type: {tensor.data_type}", f"dims: {_dims(tensor.dims)}"]
        if tensor.allow_ragged_batch:
            parts.append("allow_ragged_batch: true")
        if tensor.optional:
            parts.append("optional: true")
        blocks.append("  { " + " ".join(parts) + " }")
    return f"{kind} [\n" + ",\n".join(blocks) + "\n]"


def _dynamic_batching(batching: DynamicBatching) -> str:
    parts = [f"max_queue_delay_microseconds: {batching.max_queue_delay_microseconds}"]
    if batching.preferred_batch_size:
        parts.append(f"preferred_batch_size: {_dims(batching.preferred_batch_size)}")
    if batching.priority_levels:
        parts.append(f"priority_levels: {batching.priority_levels}")
        parts.append(f"default_priority_level: {(batching.priority_levels + 1) // 2}")
    if batching.queue is not None:
        queue = batching.queue
        parts.append("default_queue_policy { timeout_action: REJECT "
                     f"default_timeout_microseconds: {queue.timeout_microseconds} "
                     f"allow_timeout_override: {str(queue.allow_timeout_override).lower()} "
                     f"max_queue_size: {queue.max_queue_size} }}")
    return "dynamic_batching { " + " ".join(parts) + " }"


def _parameters(parameters: dict[str, Any]) -> str:
    entries = []
    for key, value in parameters.items():
        text = value if isinstance(value, str) else json.dumps(value)
        entries.append(f"  {{ key: {_q(key)} value: {{ string_value: {_q(text)} }} }}")
    return "parameters [\n" + ",\n".join(entries) + "\n]"


def _ensemble(steps: list[EnsembleStep]) -> str:
    blocks = []
    for step in steps:
        maps = [f"model_name: {_q(step.model_name)}", "model_version: -1"]
        maps += [f"input_map {{ key: {_q(k)} value: {_q(v)} }}" for k, v in step.input_map.items()]
        maps += [f"output_map {{ key: {_q(k)} value: {_q(v)} }}" for k, v in step.output_map.items()]
        blocks.append("    { " + "\n      ".join(maps) + " }")
    return "ensemble_scheduling {\n  step [\n" + ",\n".join(blocks) + "\n  ]\n}"


def read_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """Flatten Triton's parsed `parameters` (as the Python backend sees them) to key -> string."""
    return {k: v["string_value"] for k, v in (model_config.get("parameters") or {}).items()}


def parse_config(path: Path) -> Any:
    """A config.pbtxt parsed into Triton's own ModelConfig message (tritonclient ships its protobuf):
    the way to read a config back, and proof that what we write is valid Triton configuration."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())
