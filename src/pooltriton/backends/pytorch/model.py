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
from pooltriton.contract import ATTENTION_MASK
from pooltriton.core.capabilities import load_warning
from pooltriton.core.runtimes import INTRA_OP_THREADS, torchscript_precision

# Rows and width of the warm-up batch: two rows, so that both intra-op threads take part.
WARMUP_SHAPE = (2, 8)
# TorchScript's profiling executor profiles the first call and optimises the plan on the next.
WARMUP_CALLS = 2


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
        self.warm_up(model.config["input"])

    def warm_up(self, inputs: list[dict]) -> None:
        """Run a small batch before the first request, as Triton's model_warmup would for libtorch.

        TorchScript profiles and then optimises a module on its first calls, so the first request paid
        for that. Measured on this stand-in (AMX host, gpt2 encoders, 2 intra-op threads): 2 of 39 first
        calls after a server start gave the first half of their batch off by up to 2e-4 from the same
        module run on the same feeds in a fresh process; every later call was bitwise that run.
        """
        rows, width = WARMUP_SHAPE
        if self.dense:  # fixed-size inputs (an image tower): zeros of each input's own shape
            feeds = {t["name"]: np.zeros((rows, *(int(d) for d in t["dims"])),
                                         dtype=pb_utils.triton_string_to_numpy(t["data_type"])) for t in inputs}
            for _ in range(WARMUP_CALLS):
                self.run(feeds)
            return
        feeds = {name: np.zeros((rows, 1 if name in self.row_inputs else width), dtype=np.int64)
                 for name in self.input_names}
        if ATTENTION_MASK in feeds:
            feeds[ATTENTION_MASK][:] = 1
        for _ in range(WARMUP_CALLS):
            self.run(feeds)

    def device_memory(self) -> int | None:
        return torch.cuda.mem_get_info(self.device)[1] if self.device.type == "cuda" else None

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            inputs = (torch.from_numpy(feeds[name]).to(self.device, non_blocking=True) for name in self.input_names)
            output = self.module(*inputs)
        return [output.float().cpu().numpy()]
