"""Image processor stage: IMAGE (BYTES [n, 1], encoded images) -> pixel_values (FP32 [n, 3, H, W]) and
ACTIVATE ([n, 1]), decoded with Pillow under limits and preprocessed as the model's own image processor
(core.images, configured by the preprocessor_config.json the export wrote beside this stage).

A request holding an image that is empty, over a limit, truncated or not an image is refused on its own
(INVALID_ARG, naming the image by its index); the other requests of the batch are still served.
Request parameter "use_activation" (vLLM's): false answers the raw projected features.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from pooltriton.backends.common import (
    ModelArgs,
    error_response,
    input_array,
    internal_error,
    request_parameters,
    use_activation,
)
from pooltriton.contract import ACTIVATE, IMAGE, PIXEL_VALUES
from pooltriton.contract.parameters import ImageParameters
from pooltriton.core.images import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageError, ImageLimits, decode, read_processor


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model = ModelArgs(args)
        parameters = model.stage(ImageParameters)
        self.processor = read_processor(model.version_dir)
        self.limits = ImageLimits(parameters.max_image_bytes or MAX_IMAGE_BYTES,
                                  parameters.max_image_pixels or MAX_IMAGE_PIXELS)
        self.use_activation = parameters.use_activation

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request) -> object:
        try:
            activate = use_activation(request_parameters(request), self.use_activation)
        except ValueError as error:
            return error_response(str(error))
        images = input_array(request, IMAGE).reshape(-1)
        if not len(images):
            return error_response("no image: send at least one")
        rows = []
        for index, data in enumerate(images):
            try:
                rows.append(self.processor(decode(bytes(data), self.limits)))
            except ImageError as error:
                return error_response(f"image {index}: {error}")
            except Exception as error:  # Pillow's own failure: this request's, not the batch's
                return internal_error(f"image {index}: {type(error).__name__}: {error}")
        pixels = np.stack(rows)
        flags = np.full((len(rows), 1), int(activate), dtype=np.int64)
        return pb_utils.InferenceResponse([pb_utils.Tensor(PIXEL_VALUES, pixels), pb_utils.Tensor(ACTIVATE, flags)])
