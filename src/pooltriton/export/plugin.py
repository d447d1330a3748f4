"""Write the config of a plugin model: a user's IO processor around an exported pooling model."""

from __future__ import annotations

import json
from pathlib import Path

from pooltriton.contract import (
    OUTPUT_NAMES,
    PLUGIN_INPUT,
    PLUGIN_OUTPUT,
    QUEUE_SIZE,
    TOKEN_COUNTS,
    invalid_model_name,
    invalid_module_name,
)
from pooltriton.contract.config import ModelConfig, Tensor, caller_queue
from pooltriton.contract.parameters import PluginParameters
from pooltriton.core.plugins import get_plugin
from pooltriton.core.resolve import ResolutionError
from pooltriton.core.semantics import Task


def write_plugin(name: str, plugin: str, module: str | None, model: str, out: Path) -> Path:
    for problem in (invalid_model_name(name), invalid_model_name(model), module and invalid_module_name(module)):
        if problem:
            raise ResolutionError(problem)
    config_file = Path(out) / model / "pooler_config.json"
    if not config_file.is_file():
        raise ResolutionError(f"{model!r} is not an exported model in {out} (no {config_file})")
    get_plugin(plugin, module)  # fail at export, not at load, if the plugin cannot be found
    task = Task(json.loads(config_file.read_text())["task"])
    outputs = [OUTPUT_NAMES[task]] + ([TOKEN_COUNTS] if task.per_token else [])
    return ModelConfig(
        name=name, backend="plugin", max_batch_size=0,
        inputs=[Tensor(PLUGIN_INPUT, "TYPE_STRING", (-1,))], outputs=[Tensor(PLUGIN_OUTPUT, "TYPE_STRING", (-1,))],
        dynamic_batching=caller_queue(QUEUE_SIZE),
        parameters=PluginParameters(plugin=plugin, model=model, outputs=tuple(outputs), module=module).to_parameters(),
    ).write(out)
