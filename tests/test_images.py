"""Images decoded and preprocessed as CLIP's and SigLIP's own image processors do (core.images), compared with
transformers' PIL image processors on real photographs (scikit-image's) in every mode and encoding users
send; and every bad or hostile image refused with a clear error."""

from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
import skimage.data
from PIL import Image
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from pooltriton.core.images import (
    CLIPImageProcessor,
    ImageError,
    ImageLimits,
    SiglipImageProcessor,
    decode,
    read_processor,
)

PHOTOS = {"astronaut": skimage.data.astronaut(), "coffee": skimage.data.coffee(), "chelsea": skimage.data.chelsea(),
          "camera": skimage.data.camera()}


def _photo(name: str, mode: str, size: tuple[int, int] | None = None) -> Image.Image:
    image = Image.fromarray(PHOTOS[name])
    if size is not None:
        image = image.resize(size, Image.Resampling.LANCZOS)
    if mode == "RGBA":  # an alpha gradient, so the white compositing shows
        alpha = Image.linear_gradient("L").resize(image.size)
        return Image.merge("RGBA", (*image.convert("RGB").split(), alpha))
    if mode == "P":
        return image.convert("RGB").quantize(64)
    return image.convert(mode)


def _encoded(image: Image.Image, encoding: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=encoding, **options)
    return out.getvalue()


# (photo, mode, encoding, size): every mode the issue names, in every format taken, of several shapes.
CASES = [
    ("astronaut", "RGB", "PNG", None), ("coffee", "RGB", "JPEG", None), ("chelsea", "RGB", "WEBP", None),
    ("chelsea", "RGBA", "PNG", None), ("coffee", "RGBA", "WEBP", (150, 100)), ("camera", "L", "PNG", None),
    ("camera", "L", "JPEG", (200, 260)), ("astronaut", "P", "GIF", (120, 90)), ("astronaut", "P", "PNG", (64, 64)),
    ("coffee", "CMYK", "JPEG", (300, 200)), ("coffee", "CMYK", "TIFF", (90, 60)), ("chelsea", "RGB", "BMP", (45, 30)),
    ("camera", "1", "BMP", (40, 40)), ("astronaut", "LA", "PNG", (33, 17)), ("chelsea", "RGB", "TIFF", (7, 5)),
]
CONFIGS = [
    (CLIPImageProcessor, CLIPImageProcessorPil, {}),
    (CLIPImageProcessor, CLIPImageProcessorPil, {"size": {"shortest_edge": 32}, "crop_size": {"height": 32,
                                                                                               "width": 28}}),
    # a crop larger than the resized image: padded with zeros, as transformers pads it
    (CLIPImageProcessor, CLIPImageProcessorPil, {"size": {"shortest_edge": 24}, "crop_size": {"height": 30,
                                                                                               "width": 30}}),
    (SiglipImageProcessor, SiglipImageProcessorPil, {}),
    (SiglipImageProcessor, SiglipImageProcessorPil, {"size": {"height": 30, "width": 40}, "resample": 2,
                                                     "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.3, 0.25]}),
]


@pytest.mark.parametrize("ours, theirs, config", CONFIGS, ids=lambda v: getattr(v, "__name__", None) or str(v))
@pytest.mark.parametrize("photo, mode, encoding, size", CASES)
def test_pixels_equal_transformers_image_processor(ours, theirs, config, photo, mode, encoding, size) -> None:
    data = _encoded(_photo(photo, mode, size), encoding)
    reference = theirs(**config)(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    got = ours.from_dict(config)(decode(data))
    assert got.shape == reference.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, reference)  # the same steps in the same dtypes: the same bits


def test_an_animated_gif_is_read_as_its_first_frame() -> None:
    frames = [_photo("chelsea", "RGB", (60, 40)), _photo("coffee", "RGB", (60, 40))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    image = decode(out.getvalue())
    first = Image.open(io.BytesIO(out.getvalue()))
    np.testing.assert_array_equal(np.asarray(image.convert("RGB")), np.asarray(first.convert("RGB")))
    assert not np.array_equal(np.asarray(image.convert("RGB")),
                              np.asarray(frames[1].quantize(256).convert("RGB")))


def test_the_processor_is_read_from_either_file_layout(tmp_path) -> None:
    CLIPImageProcessorPil(size={"shortest_edge": 40}, crop_size={"height": 36, "width": 36}).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "preprocessor_config.json").read_text())["image_processor_type"] == \
        "CLIPImageProcessor"
    first = read_processor(tmp_path)
    assert isinstance(first, CLIPImageProcessor) and first.output_size == (36, 36)
    (tmp_path / "preprocessor_config.json").unlink()
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {
        "image_processor_type": "SiglipImageProcessor", "size": {"height": 20, "width": 24}}}))
    second = read_processor(tmp_path)
    assert isinstance(second, SiglipImageProcessor) and second.output_size == (20, 24)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {
        "image_processor_type": "BlipImageProcessor"}}))
    with pytest.raises(ImageError, match=r"BlipImageProcessor.*CLIPImageProcessor, SiglipImageProcessor"):
        read_processor(tmp_path)


def _png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height (correct CRCs) over a few bytes of data."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


def test_bad_and_hostile_images_are_refused_with_what_is_wrong() -> None:
    photo = _encoded(_photo("coffee", "RGB", (120, 80)), "PNG")
    jpeg = _encoded(_photo("coffee", "RGB", (120, 80)), "JPEG")
    refused = {
        "empty": (b"", "empty"),
        "not an image": (b"this is text, not pixels" * 10, "not an image"),
        "truncated png": (photo[: len(photo) // 2], "truncated or corrupt"),
        "truncated jpeg": (jpeg[: len(jpeg) // 3], "truncated or corrupt"),
        "jpeg cut in its header": (jpeg[:600], "truncated or corrupt"),
        "a format not taken": (_encoded(_photo("coffee", "RGB", (20, 20)), "PPM"), "not an image in a format"),
        "a decompression bomb": (_png_declaring(100_000, 100_000), "over the limit of"),
        "a bomb under Pillow's own bound": (_png_declaring(8_000, 8_000), "8000 x 8000 pixels, over the limit"),
    }
    for name, (data, message) in refused.items():
        with pytest.raises(ImageError, match=message):
            decode(data)
            pytest.fail(f"{name} was read")
    with pytest.raises(ImageError, match=f"{len(photo)} bytes, over the limit of 1000"):
        decode(photo, ImageLimits(max_bytes=1000))
    with pytest.raises(ImageError, match="120 x 80 pixels, over the limit of 9000"):
        decode(photo, ImageLimits(max_pixels=9000))
    assert decode(photo).size == (120, 80)  # and the good one still is read
