"""Export the image tower of an image-text dual encoder (CLIPModel, SiglipModel) as an image ensemble.

    <out>/<name>_image/                  ensemble: IMAGE (encoded bytes) -> EMBEDDING
    <out>/<name>_image_processor/        backend "image": decode (Pillow, under limits) and the model's own
                                         image processor (core.images); 1/preprocessor_config.json
    <out>/<name>_image_encoder/          backend "onnxruntime" / "pytorch": get_image_features and the
                                         normalisation (ACTIVATE); verification.json

Verified as text encoders are: the exported file against transformers' own model, loaded on its own, on
pixel batches of several sizes, and the image processor against transformers' PIL image processor.
"""

from __future__ import annotations

import shutil
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from pooltriton.contract import (
    ACTIVATE,
    ENCODER_OUTPUT,
    IMAGE,
    MAX_BATCH_SIZE,
    OUTPUT_NAMES,
    PIXEL_VALUES,
    image_stages,
)
from pooltriton.contract.config import EnsembleStep, ModelConfig, QueuePolicy, Tensor, stage_batching
from pooltriton.contract.parameters import EnsembleParameters, ImageParameters
from pooltriton.core.images import ImageError, ImageProcessor, read_processor
from pooltriton.core.resolve import VISION_MODEL_TYPES, ResolutionError, read_json
from pooltriton.core.runtimes import CPU, CUDA, FP16, FP32, RUNTIMES, TOLERANCES
from pooltriton.core.semantics import Task
from pooltriton.export.publish import write_json
from pooltriton.export.refusals import multimodal_refusal

RUNTIMES_TAKEN = ("onnx", "torchscript")
BATCHES = (1, 3, 8)  # images per verification batch: single, odd and full rows
NOISE_MULTIPLE = 8  # as export.verify: an error within 8 x fp32's own rounding is fp32's
PROCESSOR_FILE = "preprocessor_config.json"
IMAGE_PROCESSOR_INSTANCES = 2  # decoding is CPU work in Python: two processes overlap it


class ImageEncoder(nn.Module):
    """pixel_values [n, 3, H, W] and ACTIVATE [n, 1] -> the projected image features [n, width], normalised
    where ACTIVATE says (CLIP's and SigLIP's users compare them by cosine)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, activate: torch.Tensor) -> torch.Tensor:
        features = self.model.get_image_features(pixel_values=pixel_values)
        vectors = getattr(features, "pooler_output", features).float()
        return torch.where(activate > 0, nn.functional.normalize(vectors, dim=-1), vectors)


def load_model(model_dir: Path, allow_pickle: bool, eager: bool) -> nn.Module:
    from transformers import AutoModel

    kwargs = {"use_safetensors": None if allow_pickle else True}
    if eager:  # plain ops that both exporters handle; the reference keeps transformers' default
        kwargs["attn_implementation"] = "eager"
    try:
        return AutoModel.from_pretrained(model_dir, **kwargs).eval()
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ResolutionError(f"{model_dir}: the model cannot be loaded by transformers "
                              f"({type(error).__name__}: {first})") from error


def check_vision(model_dir: Path, hf: dict, runtime: str, precision: str, device: str) -> tuple[ImageProcessor,
                                                                                             tuple[int, int]]:
    """The image processor and the fixed (height, width) it feeds the tower; refusals say why."""
    if hf.get("model_type") not in VISION_MODEL_TYPES:
        raise ResolutionError(multimodal_refusal(hf))
    if runtime not in RUNTIMES_TAKEN:
        raise ResolutionError(f"image towers export to {' or '.join(RUNTIMES_TAKEN)}, not {runtime}")
    if precision != FP32 and not (runtime == "torchscript" and device == CUDA and precision == FP16):
        raise ResolutionError(f"image towers are verified in fp32 (and fp16 TorchScript on cuda), not {precision}")
    try:
        processor = read_processor(model_dir)
    except ImageError as error:
        raise ResolutionError(str(error)) from None
    size = processor.output_size
    expected = int((hf.get("vision_config") or {}).get("image_size", 224))
    if size is None:
        raise ResolutionError("the image processor gives images of varying size; the vision tower takes one size")
    if size != (expected, expected):
        raise ResolutionError(f"the image processor gives {size[0]}x{size[1]} images, while the vision tower "
                              f"was built for {expected}x{expected}")
    return processor, size


@dataclass(frozen=True)
class Layout:
    """Where the towers' transformers folder is, and whether the model's users get unit vectors: a
    sentence-transformers pipeline (its CLIP module, then Normalize or not) or a plain checkpoint (its
    users compare by cosine: normalised)."""

    tower: Path
    normalize: bool = True
    sentence_transformers: Path | None = None  # the pipeline's folder, where it is one


ST_TOWER_TYPES = ("CLIPModel", "Transformer")  # sentence-transformers' modules that hold a CLIP / SigLIP


def read_layout(model_dir: Path) -> Layout | None:
    """The layout of an image-text folder, or None where it is not one (a text model)."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return Layout(model_dir) if _model_type(model_dir) in VISION_MODEL_TYPES else None
    modules = read_json(modules_file) or []
    first = modules[0] if modules else {}
    tower = model_dir / first.get("path", "")
    if not str(first.get("type", "")).endswith(ST_TOWER_TYPES) or _model_type(tower) not in VISION_MODEL_TYPES:
        return None
    rest = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules[1:]]
    if any(kind != "Normalize" for kind in rest):
        raise ResolutionError(f"{model_dir}: a sentence-transformers image-text pipeline with {', '.join(rest)} after "
                              "its CLIP module is not served (its tower, then Normalize or nothing, is)")
    return Layout(tower, normalize="Normalize" in rest, sentence_transformers=model_dir)


def _model_type(folder: Path) -> str | None:
    return (read_json(folder / "config.json") or {}).get("model_type")


def sample_images() -> list[Image.Image]:
    """Deterministic images of Pillow's own (fractal, gradients, noise) in the modes and shapes users send."""
    fractal = Image.effect_mandelbrot((96, 64), (-2.0, -1.2, 1.0, 1.2), 60)
    gradient = Image.linear_gradient("L").resize((64, 96))
    radial = Image.radial_gradient("L").resize((96, 64))
    noise = Image.effect_noise((96, 64), 40)
    rgb = Image.merge("RGB", (fractal, radial, noise))
    rgba = Image.merge("RGBA", (fractal.resize((64, 96)), gradient, noise.resize((64, 96)), gradient))
    return [rgb, rgba, fractal, rgb.quantize(32), rgb.convert("CMYK"), rgb.resize((17, 40)),
            gradient.convert("RGB"), rgb.transpose(Image.Transpose.ROTATE_90)]


@dataclass
class VisionReport:
    runtime: str
    precision: str
    reference: str
    cases: list[dict]
    max_abs_error: float
    min_cosine: float
    tolerance: float
    passed: bool
    processor: dict = field(default_factory=dict)  # ours against transformers' PIL image processor

    def table(self) -> str:
        rows = [f"verification of the {self.runtime} image encoder against {self.reference} in fp64",
                f"  {'images':>6} {'max |Δ|':>9} {'fp32 noise':>10} {'allowed':>9} {'min cos':>10}"]
        rows += [f"  {c['batch']:>6} {c['max_abs_error']:>9.2e} {c['fp32_noise']:>10.2e} {c['allowed']:>9.2e} "
                 f"{c['min_cosine']:>10.7f}" for c in self.cases]
        rows.append(f"  image processor: {self.processor.get('equal', 0)} of {self.processor.get('images', 0)} "
                    f"images equal to {self.processor.get('reference', '?')} bit for bit")
        if "sentence_transformers" in self.processor:
            st = self.processor["sentence_transformers"]
            rows.append(f"  SentenceTransformer.encode of the {st['images']} images: max |Δ| {st['max_abs_error']:.2e} "
                        f"(allowed {st['allowed']:.2e}, normalised: {st['normalize']})")
        rows.append(f"  {'passed' if self.passed else 'FAILED'}: min cosine {self.min_cosine:.7f}")
        return "\n".join(rows)


def verify_processor(processor: ImageProcessor, model_type: str, images: list[Image.Image]) -> dict:
    """Our pixels against transformers' PIL image processor on the same images (the bits must agree)."""
    try:
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
        from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    except ImportError:  # another transformers: the test suite compares them
        return {"reference": "unavailable", "images": 0, "equal": 0}
    theirs = {"clip": CLIPImageProcessorPil, "siglip": SiglipImageProcessorPil}[model_type]
    reference = theirs(**{k: v for k, v in processor.to_dict().items() if k != "image_processor_type"})
    equal = sum(bool(np.array_equal(processor(image), reference(image, return_tensors="np")["pixel_values"][0]))
                for image in images)
    return {"reference": theirs.__name__, "images": len(images), "equal": equal}


def verify(layout: Layout, run, processor: ImageProcessor, model_type: str, runtime: str, precision: str,
           allow_pickle: bool, tolerance: float | None) -> VisionReport:
    model_dir = layout.tower
    images = sample_images()
    pixels = np.stack([processor(image) for image in images])
    reference = load_model(model_dir, allow_pickle, eager=False)
    fp64 = load_model(model_dir, allow_pickle, eager=False).double()
    tolerance = TOLERANCES[precision] if tolerance is None else tolerance
    cases, cosines = [], []
    for batch in BATCHES:
        rows = pixels[:batch]
        activate = np.zeros((batch, 1), dtype=np.int64)
        got = np.asarray(run({PIXEL_VALUES: rows, ACTIVATE: activate}), dtype=np.float64)
        with torch.no_grad():
            exact = _features(fp64, torch.from_numpy(rows).double())
            fp32 = _features(reference, torch.from_numpy(rows))
        noise = float(np.abs(fp32 - exact).max())
        allowed = max(tolerance * (1 + float(np.abs(exact).max())), NOISE_MULTIPLE * noise)
        error = float(np.abs(got - exact).max())
        cosine = float((np.sum(got * exact, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(exact, axis=1)).min())
        cosines.append(cosine)
        cases.append({"batch": batch, "max_abs_error": error, "fp32_noise": noise, "allowed": allowed,
                      "min_cosine": cosine, "passed": bool(np.isfinite(got).all() and error <= allowed)})
    checked = verify_processor(processor, model_type, images)
    passed = all(c["passed"] for c in cases) and checked["equal"] == checked["images"]
    if layout.sentence_transformers is not None:
        pipeline = _against_sentence_transformers(layout, run, pixels, images, tolerance)
        checked["sentence_transformers"] = pipeline
        passed = passed and pipeline["passed"]
    return VisionReport(runtime=runtime, precision=precision,
                        reference=f"transformers {type(reference).__name__}.get_image_features", cases=cases,
                        max_abs_error=max(c["max_abs_error"] for c in cases), min_cosine=min(cosines),
                        tolerance=tolerance, passed=passed, processor=checked)


def _against_sentence_transformers(layout: Layout, run, pixels: np.ndarray, images: list[Image.Image],
                                   tolerance: float) -> dict:
    """SentenceTransformer.encode of the PIL images (its own processor, its Normalize or none) against the
    exported graph as served (ACTIVATE = the pipeline's normalisation)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(layout.sentence_transformers), device="cpu")
    expected = np.asarray(model.encode(images, convert_to_numpy=True), dtype=np.float64)
    activate = np.full((len(images), 1), int(layout.normalize), dtype=np.int64)
    got = np.asarray(run({PIXEL_VALUES: pixels, ACTIVATE: activate}), dtype=np.float64)
    error = float(np.abs(got - expected).max())
    allowed = tolerance * (1 + float(np.abs(expected).max()))
    return {"images": len(images), "max_abs_error": error, "allowed": allowed, "passed": error <= allowed,
            "normalize": layout.normalize}


def _features(model: nn.Module, pixels: torch.Tensor) -> np.ndarray:
    features = model.get_image_features(pixel_values=pixels)
    return getattr(features, "pooler_output", features).double().numpy()


def export_onnx(encoder: ImageEncoder, path: Path, size: tuple[int, int]) -> None:
    batch = torch.export.Dim("batch", min=1, max=4096)
    sample = (torch.zeros(2, 3, *size), torch.tensor([[0], [1]], dtype=torch.int64))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(encoder, sample, input_names=[PIXEL_VALUES, ACTIVATE],
                                    output_names=[ENCODER_OUTPUT], dynamic_shapes=({0: batch}, {0: batch}),
                                    opset_version=18, dynamo=True, verbose=False)
    program.save(str(path))


def export_torchscript(encoder: ImageEncoder, path: Path, size: tuple[int, int], device: str, dtype) -> None:
    """Traced on the serving device in the serving dtype; the pixels come in fp32 and are cast inside."""
    module = _Cast(encoder, dtype).to(device)
    sample = (torch.zeros(2, 3, *size, device=device), torch.tensor([[0], [1]], dtype=torch.int64, device=device))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.jit.trace(module, sample, check_trace=False, strict=False).save(str(path))


class _Cast(nn.Module):
    """Named as the config's inputs (Triton's libtorch backend binds by argument name)."""

    def __init__(self, encoder: ImageEncoder, dtype) -> None:
        super().__init__()
        self.encoder, self.dtype = encoder.to(dtype), dtype

    def forward(self, pixel_values: torch.Tensor, activate: torch.Tensor) -> torch.Tensor:
        return self.encoder(pixel_values.to(self.dtype), activate).float()


def runner(path: Path, runtime: str, device: str):
    if runtime == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)[0]
    module = torch.jit.load(str(path), map_location=device).eval()

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(v).to(device) for v in feeds.values())).float().cpu().numpy()

    return run


def image_configs(options, processor: ImageProcessor, size: tuple[int, int], width: int,
                  text_model: str | None = None, normalize: bool = True) -> list[ModelConfig]:
    """processor -> encoder behind one image ensemble."""
    names = image_stages(options.name)
    runtime = RUNTIMES[options.runtime]
    queue = QueuePolicy(options.queue_size, options.queue_timeout_ms * 1000)
    batching = stage_batching(queue)
    pixels = Tensor(PIXEL_VALUES, "TYPE_FP32", (3, *size))
    activate = Tensor(ACTIVATE, "TYPE_INT64", (1,))
    pooled = Tensor(ENCODER_OUTPUT, "TYPE_FP32", (width,))
    output = Tensor(OUTPUT_NAMES[Task.EMBED], "TYPE_FP32", (width,))
    images = Tensor(IMAGE, "TYPE_STRING", (1,))
    return [
        ModelConfig(name=names.processor, backend="image", max_batch_size=MAX_BATCH_SIZE, inputs=[images],
                    outputs=[pixels, activate], dynamic_batching=batching, instance_count=IMAGE_PROCESSOR_INSTANCES,
                    parameters=ImageParameters(processor_file=PROCESSOR_FILE,
                                               use_activation=normalize).to_parameters()),
        ModelConfig(name=names.encoder, backend=runtime.backend, default_model_filename=runtime.filename,
                    max_batch_size=MAX_BATCH_SIZE, inputs=[pixels, activate], outputs=[pooled],
                    dynamic_batching=batching, instance_kind="KIND_GPU" if options.device == CUDA else "KIND_CPU",
                    parameters=runtime.parameters(options.encoder_threads, options.precision)),
        ModelConfig(name=names.ensemble, platform="ensemble", max_batch_size=MAX_BATCH_SIZE, inputs=[images],
                    outputs=[output],
                    parameters=EnsembleParameters(task=Task.EMBED.value, modality="image", use_activation=normalize,
                                                  precision=options.precision, text_model=text_model,
                                                  served_names=tuple(options.served_model_names) or None,
                                                  ).to_parameters(),
                    ensemble_steps=[EnsembleStep(names.processor, {IMAGE: IMAGE}, {PIXEL_VALUES: PIXEL_VALUES,
                                                                                    ACTIVATE: ACTIVATE}),
                                    EnsembleStep(names.encoder, {PIXEL_VALUES: PIXEL_VALUES, ACTIVATE: ACTIVATE},
                                                 {ENCODER_OUTPUT: output.name})]),
    ]


def export_image_tower(layout: Layout, options, hf: dict, progress, staging: Path,
                       text_model: str | None = None) -> VisionReport:
    """Export, verify and write the image stages into `staging` (publish moves them in)."""
    model_dir = layout.tower
    processor, size = check_vision(model_dir, hf, options.runtime, options.precision, options.device)
    names = image_stages(options.name)
    progress(f"loading {(hf.get('architectures') or ['?'])[0]}'s image tower ({size[0]}x{size[1]} images)")
    encoder = ImageEncoder(load_model(model_dir, options.allow_pickle, eager=True))
    filename = RUNTIMES[options.runtime].filename
    artefact = staging / names.encoder / "1" / filename
    progress(f"exporting the {options.runtime} image encoder to {Path(options.out) / names.encoder / '1' / filename}")
    if options.runtime == "onnx":
        export_onnx(encoder, artefact, size)
    else:
        from pooltriton.export.encoder import DTYPES

        export_torchscript(encoder, artefact, size, options.device, DTYPES[options.precision])
    with torch.no_grad():
        width = int(encoder(torch.zeros(1, 3, *size), torch.zeros(1, 1, dtype=torch.int64)).shape[-1])
    progress("verifying the image encoder against transformers' get_image_features")
    if options.device == CUDA and not torch.cuda.is_available():
        raise ResolutionError("--device cuda: this machine has no GPU to verify the traced tower on")
    report = verify(layout, runner(artefact, options.runtime, options.device if options.device == CUDA else CPU),
                    processor, hf["model_type"], options.runtime, options.precision, options.allow_pickle,
                    options.tolerance)
    print(report.table(), file=sys.stderr)
    if not report.passed:
        shutil.rmtree(staging / names.encoder, ignore_errors=True)
        raise ResolutionError(f"the exported image encoder does not match transformers (max |Δ| "
                              f"{report.max_abs_error:.2e}, processor {report.processor})")
    for model in image_configs(options, processor, size, width, text_model, layout.normalize):
        model.write(staging)
    write_json(staging / names.processor / "1" / PROCESSOR_FILE, processor.to_dict())
    write_json(staging / names.encoder / "verification.json", asdict(report))
    return report
