"""An export's output is its own step lines and the verification result: the libraries it
drives are told to keep their warnings and progress bars to themselves unless `--verbose`."""

from __future__ import annotations

import logging
import os


def quiet_libraries() -> None:
    """torch's "torchvision is not installed. Skipping ..." warnings (from torch.onnx's registry) and
    transformers' and huggingface_hub's loading bars and notices; errors still show."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch  # noqa: F401  (its logging set up first, so the levels below stay)
    import transformers

    logging.getLogger("torch").setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("nncf").setLevel(logging.ERROR)
