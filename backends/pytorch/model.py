"""Python stand-in for Triton's native `pytorch` (libtorch) backend: runs the same TorchScript model.pt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pooltriton.backends.shim import EncoderShim


class TritonPythonModel(EncoderShim):
    default_filename = "model.pt"

    def load(self, path: Path, threads: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.module = torch.jit.load(str(path)).eval()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            output = self.module(*(torch.from_numpy(feeds[name]) for name in self.input_names))
        return [output.numpy()]
