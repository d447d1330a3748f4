"""One typed description of a Triton model, rendered to `config.pbtxt`.

Every config in the generated repository comes from these dataclasses; there are no per-task
templates. They are built into Triton's own protobuf message (model_config.proto, shipped with
tritonclient) and written by protobuf's `text_format`, which also reads them back (`parse_config`).
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
    default_priority_level: int = 0  # 0: the middle level
    queue: QueuePolicy | None = None


def stage_batching(queue: QueuePolicy) -> DynamicBatching:
    """A batched stage's batcher: no queue delay (under load requests queue while the model runs anyway;
    idle, a delay is pure latency on a single text), the contract's priority levels, `queue`."""
    from pooltriton.contract import DEFAULT_PRIORITY_LEVEL, PRIORITY_LEVELS

    return DynamicBatching(max_queue_delay_microseconds=0, priority_levels=PRIORITY_LEVELS,
                           default_priority_level=DEFAULT_PRIORITY_LEVEL, queue=queue)


def caller_queue(max_queue_size: int) -> DynamicBatching:
    """The queue of a stage that calls an ensemble through BLS (scorer, plugin; max_batch_size 0, so
    Triton batches nothing): at most `max_queue_size` waiting, more rejected at once (Triton's default
    scheduler queues without bound). No queue timeout of its own, so the stage's policy expires nothing
    that waits there; the ensemble it calls admits by work and applies its queue timeout."""
    return DynamicBatching(max_queue_delay_microseconds=0, queue=QueuePolicy(max_queue_size, 0))


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

    def message(self) -> Any:
        """This config as Triton's own ModelConfig protobuf message (model_config.proto)."""
        from tritonclient.grpc import model_config_pb2 as pb

        config = pb.ModelConfig(name=self.name, max_batch_size=self.max_batch_size)
        if self.platform:
            config.platform = self.platform
        if self.backend:
            config.backend = self.backend
        if self.default_model_filename:
            config.default_model_filename = self.default_model_filename
        for tensor in self.inputs:
            config.input.add(name=tensor.name, data_type=pb.DataType.Value(tensor.data_type), dims=tensor.dims,
                             allow_ragged_batch=tensor.allow_ragged_batch, optional=tensor.optional)
        for tensor in self.outputs:  # outputs are never ragged or optional in model_config.proto
            config.output.add(name=tensor.name, data_type=pb.DataType.Value(tensor.data_type), dims=tensor.dims)
        if self.dynamic_batching is not None:
            _dynamic_batching(config.dynamic_batching, self.dynamic_batching)
        if self.platform != "ensemble":
            kind = pb.ModelInstanceGroup.Kind.Value(self.instance_kind)
            config.instance_group.add(count=self.instance_count, kind=kind)
        for accelerator in self.gpu_accelerators:
            config.optimization.execution_accelerators.gpu_execution_accelerator.add(
                name=accelerator.name, parameters=accelerator.parameters)
        for key, value in self.parameters.items():
            config.parameters[key].string_value = value if isinstance(value, str) else json.dumps(value)
        for step in self.ensemble_steps:
            config.ensemble_scheduling.step.add(model_name=step.model_name, model_version=-1,
                                                input_map=step.input_map, output_map=step.output_map)
        return config

    def render(self) -> str:
        """config.pbtxt, written by protobuf's text_format (and so parsed back by it, as Triton does)."""
        from google.protobuf import text_format

        return text_format.MessageToString(self.message())

    def write(self, repository: Path) -> Path:
        """Write `<repository>/<name>/config.pbtxt` and the version folder Triton requires."""
        model_dir = Path(repository) / self.name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        (model_dir / "config.pbtxt").write_text(self.render(), encoding="utf-8")
        return model_dir


def _dynamic_batching(message: Any, batching: DynamicBatching) -> None:
    from tritonclient.grpc import model_config_pb2 as pb

    message.max_queue_delay_microseconds = batching.max_queue_delay_microseconds
    message.preferred_batch_size.extend(batching.preferred_batch_size)
    if batching.priority_levels:
        message.priority_levels = batching.priority_levels
        message.default_priority_level = batching.default_priority_level or (batching.priority_levels + 1) // 2
    if batching.queue is not None:
        policy = message.default_queue_policy
        policy.timeout_action = pb.ModelQueuePolicy.REJECT
        policy.default_timeout_microseconds = batching.queue.timeout_microseconds
        policy.allow_timeout_override = batching.queue.allow_timeout_override
        policy.max_queue_size = batching.queue.max_queue_size


def read_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """Flatten Triton's parsed `parameters` (as the Python backend sees them) to key -> string."""
    return {k: v["string_value"] for k, v in (model_config.get("parameters") or {}).items()}


def parse_config(path: Path) -> Any:
    """A config.pbtxt parsed into Triton's own ModelConfig message (tritonclient ships its protobuf):
    the way to read a config back, and proof that what we write is valid Triton configuration."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())


def repository_models(repository: Path) -> list[str]:
    """The models of a repository: its folders that hold a config.pbtxt, hidden ones aside. Triton's own
    `--load-model=*` takes every folder for a model and fails to start on one that is not (a volume's
    lost+found, an export's staging folder)."""
    return sorted(path.parent.name for path in Path(repository).glob("*/config.pbtxt")
                  if not path.parent.name.startswith("."))
