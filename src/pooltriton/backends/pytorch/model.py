"""Python stand-in for Triton's native `pytorch` (libtorch) backend: runs the same TorchScript model.pt.

KIND_GPU instances run it on their GPU (the export traced it there, in its precision: fp16 for GPUs);
the output is fp32 either way (the encoder casts it), as the config declares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import ModelArgs
from pooltriton.backends.shim import EncoderShim
from pooltriton.core.capabilities import load_warning
from pooltriton.core.runtimes import INTRA_OP_THREADS, torchscript_precision


class TritonPythonModel(EncoderShim):
    default_filename = "model.pt"

    def load(self, path: Path, model: ModelArgs) -> None:
        threads = model.integer(INTRA_OP_THREADS, 0)
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(model.device)
        self.module = torch.jit.load(str(path), map_location=self.device).eval()
        if self.device.type == "cpu":
            precision = torchscript_precision(self.module)
            warning = load_warning(precision, precision)
            if warning:
                pb_utils.Logger.log_warn(f"{model.name}: {warning}")

    def device_memory(self) -> int | None:
        return torch.cuda.mem_get_info(self.device)[1] if self.device.type == "cuda" else None

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            inputs = (torch.from_numpy(feeds[name]).to(self.device, non_blocking=True) for name in self.input_names)
            output = self.module(*inputs)
        return [output.float().cpu().numpy()]
