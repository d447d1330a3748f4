"""Images as a vision tower reads them: encoded bytes decoded with Pillow under limits, then the model's own
image processor (its `preprocessor_config.json`) applied as transformers' PIL backend applies it.

One class per family, configured by its file, as transformers keeps them: `CLIPImageProcessor` (resize
the shortest edge, centre crop) and `SiglipImageProcessor` (resize to a fixed size). Each step is the one
transformers runs (`image_processing_backends.PilBackend`, `image_transforms`), in the same dtypes, so the
pixels are the same to the bit: RGB conversion compositing transparency onto white, Pillow's resize of the
8-bit image, the crop, rescale in float64 cast to float32, then (x - mean) / std in float32.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image, UnidentifiedImageError

# The encodings taken (Pillow's format names): PNG, JPEG, WebP, GIF (its first frame), BMP, TIFF.
FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"})
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # vLLM's and OpenAI's limit on one image
# Pixels one image may decode to: ~8K x 4K. A few kilobytes can declare far more (a decompression bomb).
MAX_IMAGE_PIXELS = 32 * 1024 * 1024

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)


class ImageError(ValueError):
    """An input that is not an image this server takes: the message says which limit or why."""


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS


def decode(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Encoded bytes as a loaded Pillow image (a GIF's first frame), or ImageError: empty, over the byte or
    pixel limit (checked from the header, before any pixel is decoded), not an image, a format not taken,
    truncated or corrupt."""
    if not data:
        raise ImageError("the image is empty")
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image is {len(data)} bytes, over the limit of {limits.max_bytes}")
    try:
        image = Image.open(io.BytesIO(data), formats=sorted(FORMATS))
    except UnidentifiedImageError:
        raise ImageError(f"not an image in a format taken here ({', '.join(sorted(FORMATS))})") from None
    except Image.DecompressionBombError as error:  # Pillow's own bound, far above ours, hit at open
        raise ImageError(f"the image is over the limit of {limits.max_pixels} pixels ({error})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as error:  # cut inside its header
        raise ImageError(f"the image is truncated or corrupt ({error})") from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ImageError(f"the image is {width} x {height} pixels, over the limit of {limits.max_pixels} "
                         "(a decompression bomb, or too large)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.seek(0)
            image.load()
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as error:
        raise ImageError(f"the image is truncated or corrupt ({error})") from None
    return image


def encoded(image: bytes | str | Path | Image.Image) -> bytes:
    """What a client sends for an image: bytes as they are, a file's bytes, a Pillow image as PNG."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, (str, Path)):
        return Path(image).read_bytes()
    if isinstance(image, Image.Image):
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()
    raise TypeError(f"an image is bytes, a file path or a PIL image, not {type(image).__name__}")


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' convert_to_rgb: transparency (an alpha band, or a palette's transparent index)
    composited onto white; any other mode (L, P, CMYK, I;16, ...) converted by Pillow."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


@dataclass(frozen=True)
class ImageProcessor:
    """transformers' PIL image processor steps, with a family's defaults (the subclasses') under what its
    file says. `size`: {"shortest_edge"} or {"height", "width"} (CLIP's and SigLIP's)."""

    do_convert_rgb: bool = True
    do_resize: bool = True
    size: dict[str, int] = field(default_factory=dict)
    resample: int = Image.Resampling.BICUBIC
    do_center_crop: bool = False
    crop_size: dict[str, int] = field(default_factory=dict)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = IMAGENET_STANDARD_MEAN
    image_std: tuple[float, ...] = IMAGENET_STANDARD_STD

    DEFAULTS: ClassVar[dict[str, Any]] = {}
    KEYS: ClassVar[tuple[str, ...]] = ("do_convert_rgb", "do_resize", "size", "resample", "do_center_crop",
                                       "crop_size", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                                       "image_std")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ImageProcessor:
        values = {**cls.DEFAULTS, **{key: config[key] for key in cls.KEYS if config.get(key) is not None}}
        for key in ("image_mean", "image_std"):
            if key in values:
                mean = values[key]
                values[key] = tuple(mean) if isinstance(mean, (list, tuple)) else (float(mean),) * 3
        if isinstance(values.get("size"), int):  # an old config's int: the shortest edge
            values["size"] = {"shortest_edge": values["size"]}
        if isinstance(values.get("crop_size"), int):
            values["crop_size"] = {"height": values["crop_size"], "width": values["crop_size"]}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """This processor as a preprocessor_config.json that from_dict (and transformers) read back."""
        values = {key: getattr(self, key) for key in self.KEYS if getattr(self, key) != {}}
        return {"image_processor_type": type(self).__name__, **values,
                "image_mean": list(self.image_mean), "image_std": list(self.image_std)}

    def __call__(self, image: Image.Image) -> np.ndarray:
        """The image as the vision tower's pixel_values row: float32, (channels, height, width)."""
        if self.do_convert_rgb:
            image = to_rgb(image)
        if self.do_resize:
            height, width = self.resized(image.height, image.width)
            image = image.resize((width, height), resample=Image.Resampling(self.resample))
        pixels = np.asarray(image)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        if self.do_center_crop:
            pixels = center_crop(pixels, self.crop_size["height"], self.crop_size["width"])
        values: np.ndarray = pixels
        if self.do_rescale:
            values = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            values = values if np.issubdtype(values.dtype, np.floating) else values.astype(np.float32)
            mean = np.array(self.image_mean, dtype=values.dtype)
            std = np.array(self.image_std, dtype=values.dtype)
            values = (values - mean) / std
        return np.ascontiguousarray(np.moveaxis(values, -1, 0), dtype=np.float32)

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) to resize to, as transformers computes it."""
        size = self.size
        if size.get("shortest_edge") and not size.get("longest_edge"):
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = size["shortest_edge"], int(size["shortest_edge"] * long / short)
            return (new_long, new_short) if width <= height else (new_short, new_long)
        if size.get("height") and size.get("width"):
            return size["height"], size["width"]
        raise ImageError(f"the image processor's size {size!r} is not one this server reads")

    @property
    def output_size(self) -> tuple[int, int] | None:
        """The (height, width) every image comes out at, where that is fixed."""
        if self.do_center_crop:
            return self.crop_size["height"], self.crop_size["width"]
        if self.do_resize and self.size.get("height") and self.size.get("width"):
            return self.size["height"], self.size["width"]
        return None


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """transformers' center_crop of an (H, W, C) array, padded with zeros where the image is smaller."""
    rows, cols = pixels.shape[:2]
    top, left = (rows - height) // 2, (cols - width) // 2
    if top >= 0 and left >= 0 and top + height <= rows and left + width <= cols:
        return pixels[top:top + height, left:left + width]
    new_rows, new_cols = max(height, rows), max(width, cols)
    padded = np.zeros((new_rows, new_cols, pixels.shape[2]), dtype=pixels.dtype)
    top_pad, left_pad = math.ceil((new_rows - rows) / 2), math.ceil((new_cols - cols) / 2)
    padded[top_pad:top_pad + rows, left_pad:left_pad + cols] = pixels
    top, left = max(top + top_pad, 0), max(left + left_pad, 0)
    return padded[top:top + height, left:left + width]


class CLIPImageProcessor(ImageProcessor):
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "size": {"shortest_edge": 224}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224},
        "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD}


class SiglipImageProcessor(ImageProcessor):
    DEFAULTS: ClassVar[dict[str, Any]] = {"size": {"height": 224, "width": 224}}


# The image processors by the name a config gives (transformers' class, with or without its backend suffix).
PROCESSORS: dict[str, type[ImageProcessor]] = {"CLIPImageProcessor": CLIPImageProcessor,
                                                "SiglipImageProcessor": SiglipImageProcessor}


def read_processor(folder: Path) -> ImageProcessor:
    """The image processor a model folder describes: `preprocessor_config.json` (a checkpoint's), or the
    `image_processor` inside `processor_config.json` (what save_pretrained of a processor writes)."""
    config: dict[str, Any] | None = None
    if (folder / "preprocessor_config.json").is_file():
        config = json.loads((folder / "preprocessor_config.json").read_text())
    elif (folder / "processor_config.json").is_file():
        config = json.loads((folder / "processor_config.json").read_text()).get("image_processor")
    if not config:
        raise ImageError(f"{folder} has no image processor (preprocessor_config.json or processor_config.json)")
    name = str(config.get("image_processor_type", "")).removesuffix("Pil").removesuffix("Fast")
    if name not in PROCESSORS:
        raise ImageError(f"image processor {name or 'unnamed'!r} is not one this server reproduces: "
                         f"{', '.join(PROCESSORS)}")
    return PROCESSORS[name].from_dict(config)
