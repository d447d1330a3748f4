"""Image towers through Triton: tiny seeded CLIP and SigLIP checkpoints exported to ONNX and TorchScript,
served behind the image processor stage; embeddings of real photographs (scikit-image's, in every mode
and several sizes) equal transformers' own get_image_features on its own PIL image processor's pixels,
and every bad image refused on its own with a clear 400 while the server keeps serving."""

from __future__ import annotations

import asyncio
import io
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import torch
import tritonclient.grpc.aio as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tiny_vision import build_clip, build_siglip, build_st_clip
from transformers import AutoModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from pooltriton.contract import IMAGE
from pooltriton.core.resolve import ResolutionError
from pooltriton.export.build import ExportOptions, export_model

from conftest import start_server

PHOTOS = {"astronaut": skimage.data.astronaut(), "coffee": skimage.data.coffee(), "chelsea": skimage.data.chelsea(),
          "camera": skimage.data.camera()}
# (photo, mode, format, size): RGB, RGBA, grayscale, palette and CMYK JPEG, large and small, wide and tall.
CASES = [("astronaut", "RGB", "PNG", None), ("coffee", "RGB", "JPEG", (300, 200)), ("chelsea", "RGBA", "PNG", None),
         ("camera", "L", "PNG", (120, 180)), ("astronaut", "P", "GIF", (90, 60)), ("coffee", "CMYK", "JPEG", None),
         ("chelsea", "RGB", "WEBP", (40, 25)), ("camera", "L", "TIFF", (31, 33))]
# name -> (builder, runtime, transformers' PIL processor)
MODELS = {"clip": (build_clip, "onnx", CLIPImageProcessorPil), "clip_ts": (build_clip, "torchscript",
                                                                          CLIPImageProcessorPil),
          "siglip": (build_siglip, "onnx", SiglipImageProcessorPil)}
TOLERANCE = 1e-5


def photo(name: str, mode: str, fmt: str, size: tuple[int, int] | None) -> bytes:
    image = Image.fromarray(PHOTOS[name])
    image = image.resize(size, Image.Resampling.LANCZOS) if size else image
    if mode == "RGBA":
        image = Image.merge("RGBA", (*image.convert("RGB").split(), Image.linear_gradient("L").resize(image.size)))
    else:
        image = image.convert("RGB").quantize(64) if mode == "P" else image.convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def processor_config(folder: Path) -> dict:
    if (folder / "preprocessor_config.json").is_file():
        return json.loads((folder / "preprocessor_config.json").read_text())
    return json.loads((folder / "processor_config.json").read_text())["image_processor"]


def reference(folder: Path, processor: type, images: list[bytes], normalize: bool = True) -> np.ndarray:
    """transformers on its own: its PIL image processor, its model (default attention), its features."""
    config = {k: v for k, v in processor_config(folder).items() if k != "image_processor_type"}
    pixels = processor(**config)([Image.open(io.BytesIO(d)) for d in images], return_tensors="pt")["pixel_values"]
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        features = model.get_image_features(pixel_values=pixels).pooler_output
    return (torch.nn.functional.normalize(features, dim=-1) if normalize else features).numpy()


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vision")
    repository = root / "repository"
    folders = {}
    for name, (build, runtime, _processor) in MODELS.items():
        folders[name] = folders.get(name) or build(root / name)
        export_model(folders[name], ExportOptions(name=name, out=repository, runtime=runtime))
    folders["st_clip"] = build_st_clip(root / "st_clip")
    export_model(folders["st_clip"], ExportOptions(name="st_clip", out=repository))
    server = start_server(repository, root / "server.log")
    yield server, folders
    assert server.stop() == 0


def infer_http(server, model: str, images: list[bytes], **parameters) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput(IMAGE, [len(images), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object).reshape(-1, 1))
    return client.infer(f"{model}_image", [tensor], parameters=parameters or None).as_numpy("EMBEDDING")


async def infer_grpc(server, model: str, images: list[bytes]):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput(IMAGE, [len(images), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(images, dtype=object).reshape(-1, 1))
        return (await client.infer(f"{model}_image", [tensor])).as_numpy("EMBEDDING")
    finally:
        await client.close()


@pytest.mark.parametrize("model", list(MODELS))
def test_served_image_embeddings_equal_transformers(vision, model: str) -> None:
    server, folders = vision
    images = [photo(*case) for case in CASES]
    expected = reference(folders[model], MODELS[model][2], images)
    np.testing.assert_allclose(infer_http(server, model, images), expected, atol=TOLERANCE, rtol=0)
    one_by_one = np.concatenate([asyncio.run(infer_grpc(server, model, [image])) for image in images])
    np.testing.assert_allclose(one_by_one, expected, atol=TOLERANCE, rtol=0)
    raw = infer_http(server, model, images[:3], use_activation=False)
    np.testing.assert_allclose(raw, reference(folders[model], MODELS[model][2], images[:3], normalize=False),
                               atol=TOLERANCE * (1 + np.abs(raw).max()), rtol=0)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)  # the raw features are not the normalised ones


TEXTS = ["a photo of an astronaut", "a cup of coffee on a table", "a cat", "Ünïcödé text, and 😀 emoji!",
         "a grayscale photograph of a man holding a camera on a tripod"]


def text_reference(folder: Path, texts: list[str], padded: bool) -> np.ndarray:
    """transformers on its own: its tokenizer (SigLIP's padded to its length, as its processor pads), its model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    rows = []
    with torch.no_grad():
        for text in texts:  # each alone: the served batch pads, the reference does not
            made = tokenizer([text], return_tensors="pt", **({"padding": "max_length", "max_length": 64}
                                                               if padded else {}))
            if padded:
                made.pop("attention_mask", None)
            rows.append(model.get_text_features(**made).pooler_output[0])
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


@pytest.mark.parametrize("model", list(MODELS))
def test_text_tower_and_image_text_scores_equal_transformers(vision, model: str) -> None:
    from pooltriton.client import PoolingClient

    server, folders = vision
    expected = text_reference(folders[model], TEXTS, padded=model == "siglip")
    images = [photo(*case) for case in CASES[:3]]
    with PoolingClient(server.grpc_url, protocol="grpc") as client:
        texts = client.embed(TEXTS, model=model)
        np.testing.assert_allclose(texts, expected, atol=TOLERANCE, rtol=0)
        # image-text similarity as CLIP's logits_per_image before its scale: the cosine of the two towers'
        pixels = reference(folders[model], MODELS[model][2], images)
        scores = client.score(TEXTS[0], TEXTS[1:3], model=model)
        np.testing.assert_allclose(scores, expected[1:3] @ expected[0], atol=TOLERANCE)
        served = client.embed_images(images, model=model) @ texts.T
    np.testing.assert_allclose(served, pixels @ expected.T, atol=2 * TOLERANCE)
    np.testing.assert_allclose(served, model_cosines(folders[model], MODELS[model][2], images, TEXTS,
                                                     padded=model == "siglip"), atol=2 * TOLERANCE)


def model_cosines(folder: Path, processor: type, images: list[bytes], texts: list[str], padded: bool) -> np.ndarray:
    """transformers' own image-text logits (CLIPModel / SiglipModel forward), their scale and bias taken off."""
    from transformers import AutoTokenizer

    config = {k: v for k, v in processor_config(folder).items() if k != "image_processor_type"}
    pixels = processor(**config)([Image.open(io.BytesIO(d)) for d in images], return_tensors="pt")["pixel_values"]
    made = AutoTokenizer.from_pretrained(folder)(texts, return_tensors="pt", padding="max_length" if padded else True,
                                                 max_length=64 if padded else None)
    if padded:
        made.pop("attention_mask")
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(pixel_values=pixels, **made).logits_per_image
        bias = getattr(model, "logit_bias", None)
        return ((logits - (bias if bias is not None else 0)) / model.logit_scale.exp()).numpy()


def _bomb() -> bytes:
    """A valid PNG header declaring 100000 x 100000 pixels (a decompression bomb's)."""
    import struct
    import zlib

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk
            + struct.pack(">I", zlib.crc32(chunk) & 0xFFFFFFFF))


BAD = {"not an image": b"GIF89a? no, plain text", "empty": b"",
       "truncated": photo("coffee", "RGB", "JPEG", (200, 150))[:600], "bomb": _bomb(),
       "unknown format": b"\x00\x00\x01\x00" + bytes(200)}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_images_are_refused_alone_and_the_server_keeps_serving(vision, kind: str) -> None:
    server, folders = vision
    good = photo("astronaut", "RGB", "PNG", (64, 64))

    async def both():
        return await asyncio.gather(infer_grpc(server, "clip", [good, BAD[kind]]), infer_grpc(server, "clip", [good]),
                                    return_exceptions=True)

    refused, served = asyncio.run(both())
    assert "image 1:" in str(refused) and "StatusCode.INVALID_ARGUMENT" in str(refused), refused
    np.testing.assert_allclose(served, reference(folders["clip"], CLIPImageProcessorPil, [good]), atol=TOLERANCE)
    with pytest.raises(Exception, match="image 0") as error:
        infer_http(server, "clip", [BAD[kind]])
    assert "400" in str(error.value) or "Bad Request" in str(error.value) or error.value.status() == "400"


def test_multimodal_architectures_not_supported_are_refused_by_name(tmp_path: Path) -> None:
    for model_type, architecture in (("llava_next", "LlavaNextForConditionalGeneration"), ("clap", "ClapModel"),
                                     ("siglip2", "Siglip2Model")):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture]}))
        (folder / "tokenizer.json").write_text("{}")
        with pytest.raises(ResolutionError, match=f"{architecture}.*not supported.*clip, siglip.*text side alone"):
            export_model(folder, ExportOptions(name="m", out=tmp_path / "repository"))
    assert not (tmp_path / "repository" / "m").exists()


def test_image_tower_refuses_what_it_cannot_verify(tmp_path: Path) -> None:
    folder = build_clip(tmp_path)
    with pytest.raises(ResolutionError, match="onnx or torchscript, not openvino"):
        export_model(folder, ExportOptions(name="m", out=tmp_path / "repository", runtime="openvino"))
    config = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**config, "crop_size": {"height": 24, "width": 24}}))
    with pytest.raises(ResolutionError, match="24x24 images, while the vision tower was built for 32x32"):
        export_model(folder, ExportOptions(name="m", out=tmp_path / "repository"))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_python_client_embeds_bytes_paths_and_pil_images(vision, protocol: str, tmp_path: Path) -> None:
    from pooltriton.client import PoolingClient

    server, folders = vision
    images = [photo(*case) for case in CASES[:4]]
    path = tmp_path / "photo.jpg"
    path.write_bytes(images[1])
    inputs = [images[0], path, str(path), Image.open(io.BytesIO(images[2])), images[3]]
    expected = reference(folders["siglip"], SiglipImageProcessorPil, [images[0], images[1], images[1], images[2],
                                                                       images[3]])
    url = server.http_url if protocol == "http" else server.grpc_url
    with PoolingClient(url, protocol=protocol) as client:
        # the export's name finds its image tower (siglip_image); so does the image ensemble's own name
        np.testing.assert_allclose(client.embed_images(inputs, model="siglip"), expected, atol=TOLERANCE)
        np.testing.assert_allclose(client.embed_images(inputs[:1], model="siglip_image"), expected[:1], atol=TOLERANCE)
        with pytest.raises(LookupError, match="no model 'minilm' with an image tower"):
            client.embed_images(inputs[:1], model="minilm")
        with pytest.raises(Exception, match="image 0: not an image"):
            client.embed_images([b"plain text"], model="clip")


@contextmanager
def gateway(server, **options):
    import httpx

    from conftest import running_gateway

    with running_gateway(server.grpc_url, admin_key=server.admin_key, **options) as base, \
            httpx.Client(base_url=base, timeout=60) as http:
        yield http


def data_url(data: bytes, kind: str = "png") -> str:
    import base64

    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def test_gateway_routes_embed_images_as_vllm_cohere_and_infinity_send_them(vision) -> None:
    server, folders = vision
    images = [photo(*case) for case in CASES[:3]]
    expected = reference(folders["clip"], CLIPImageProcessorPil, images)
    with gateway(server) as http:
        # vLLM: one message of one image_url part; the export's name finds the image tower
        for index, image in enumerate(images):
            body = {"model": "clip", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}}]}]}
            answer = http.post("/v1/embeddings", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "clip"
            np.testing.assert_allclose(answer.json()["data"][0]["embedding"], expected[index], atol=TOLERANCE)
        # vLLM's /pooling takes the same chat form
        answer = http.post("/pooling", json={"model": "clip", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(images[0])}}]}]})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["data"][0]["data"], expected[0], atol=TOLERANCE)
        # infinity: modality "image", input a list of data URLs
        answer = http.post("/v1/embeddings", json={"model": "clip_image", "modality": "image",
                                                  "input": [data_url(i) for i in images]})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], expected, atol=TOLERANCE)
        # Cohere v2: images, and inputs of image_url parts
        for body in ({"model": "clip", "images": [data_url(i) for i in images], "input_type": "image"},
                     {"model": "clip", "inputs": [{"content": [{"type": "image_url",
                                                                "image_url": {"url": data_url(i)}}]} for i in images]}):
            answer = http.post("/v2/embed", json=body)
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose(answer.json()["embeddings"]["float"], expected, atol=TOLERANCE)


REFUSED = {
    "remote url": ("https://example.com/cat.png", "does not fetch images from https URLs"),
    "loopback url": ("http://127.0.0.1:8000/v2/health/ready", "does not fetch images from http URLs"),
    "local file": ("file:///etc/passwd", "does not fetch images from file URLs"),
    "not base64": ("data:image/png;base64,@@@@", "base64 is not valid"),
    "not an image type": ("data:text/plain;base64,aGVsbG8=", "holds text/plain, not an image"),
    "not an image": (data_url(b"hello, not pixels"), "image 1: not an image"),
    "truncated": (data_url(photo("coffee", "RGB", "JPEG", (200, 150))[:900], "jpeg"),
                  "image 1: the image is truncated"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_gateway_refuses_urls_it_does_not_fetch_and_bad_images_with_a_400(vision, kind: str) -> None:
    server, _folders = vision
    url, message = REFUSED[kind]
    good = data_url(photo("astronaut", "RGB", "PNG", (40, 40)))
    with gateway(server) as http:
        answer = http.post("/v1/embeddings", json={"model": "clip", "modality": "image", "input": [good, url]})
        assert answer.status_code == 400, answer.text
        assert message in answer.json()["error"]["message"]
        assert http.post("/v1/embeddings", json={"model": "clip", "modality": "image",
                                                 "input": [good]}).status_code == 200  # still serving
        text = http.post("/v1/embeddings", json={"model": "clip_image", "input": "a text"})
        assert text.status_code == 400 and "embeds images" in text.json()["error"]["message"]


def test_gateway_embeds_texts_and_scores_images_against_a_text_as_vllm(vision) -> None:
    server, folders = vision
    images = [photo(*case) for case in CASES[:3]]
    texts = text_reference(folders["clip"], TEXTS[:2], padded=False)
    cosines = model_cosines(folders["clip"], CLIPImageProcessorPil, images, TEXTS[:1], padded=False)[:, 0]
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    with gateway(server) as http:
        # vLLM's chat form of one text part, and plain `input`: the text tower
        for body in ({"model": "clip", "messages": [{"role": "user", "content": [{"type": "text", "text": TEXTS[0]}]}]},
                     {"model": "clip", "input": TEXTS[:2]}):
            answer = http.post("/v1/embeddings", json=body)
            assert answer.status_code == 200, answer.text
            got = [d["embedding"] for d in answer.json()["data"]]
            np.testing.assert_allclose(got, texts[: len(got)], atol=TOLERANCE)
        # /score: a text query against image documents (content parts), by cosine
        for second in ({"documents": {"content": parts}}, {"data_2": [{"content": [part]} for part in parts]}):
            first = "queries" if "documents" in second else "data_1"
            answer = http.post("/score", json={"model": "clip", first: TEXTS[0], **second})
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose([d["score"] for d in answer.json()["data"]], cosines, atol=2 * TOLERANCE)
        answer = http.post("/rerank", json={"model": "clip", "query": TEXTS[0], "documents": {"content": parts},
                                            "top_n": 2})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [r["index"] for r in results] == list(np.argsort(-cosines)[:2])
        np.testing.assert_allclose([r["relevance_score"] for r in results], np.sort(cosines)[::-1][:2],
                                   atol=2 * TOLERANCE)
        mixed = http.post("/score", json={"model": "clip", "queries": TEXTS[0],
                                          "documents": {"content": [parts[0], {"type": "text", "text": "x"}]}})
        assert mixed.status_code == 400 and "image_url part" in mixed.json()["error"]["message"]


def test_a_second_serve_of_an_image_text_folder_skips_its_export(tmp_path: Path) -> None:
    from pooltriton.export.defaults import export_unless_current

    folder = build_clip(tmp_path)
    options = ExportOptions(name="clip", out=tmp_path / "repository")
    assert export_unless_current(folder, options)
    stamp = json.loads((tmp_path / "repository" / "clip" / "export_stamp.json").read_text())
    assert 0 <= stamp["max_abs_error"] < TOLERANCE
    assert not export_unless_current(folder, options)  # `pooltriton serve` again: seconds, not an export
    (folder / "tokenizer.json").unlink()  # no fast tokenizer: the image tower alone, stamped there
    image_only = ExportOptions(name="pictures", out=tmp_path / "repository")
    assert export_unless_current(folder, image_only) and not export_unless_current(folder, image_only)
    assert (tmp_path / "repository" / "pictures_image" / "export_stamp.json").is_file()
    assert not (tmp_path / "repository" / "pictures").exists()


def test_a_sentence_transformers_clip_pipeline_serves_what_its_encode_answers(vision) -> None:
    """The layout of sentence-transformers' clip-ViT-B-32 (its CLIP module in 0_CLIPModel, no Normalize):
    images and texts answered as SentenceTransformer.encode answers them, raw, unless normalize is asked."""
    from sentence_transformers import SentenceTransformer

    from pooltriton.client import PoolingClient

    server, folders = vision
    model = SentenceTransformer(str(folders["st_clip"]), device="cpu")
    images = [photo(*case) for case in CASES]
    expected_images = model.encode([Image.open(io.BytesIO(d)) for d in images])
    expected_texts = model.encode(TEXTS)
    with PoolingClient(server.grpc_url, protocol="grpc") as client:
        got = client.embed_images(images, model="st_clip")
        np.testing.assert_allclose(got, expected_images, atol=TOLERANCE * (1 + np.abs(expected_images).max()))
        np.testing.assert_allclose(client.embed(TEXTS, model="st_clip"), expected_texts,
                                   atol=TOLERANCE * (1 + np.abs(expected_texts).max()))
        unit = client.embed_images(images[:2], model="st_clip", use_activation=True)
        np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-6)
    with gateway(server) as http:  # scored by cosine, though the pipeline answers raw vectors
        answer = http.post("/score", json={"model": "st_clip", "queries": TEXTS[0], "documents": {"content": [
            {"type": "image_url", "image_url": {"url": data_url(image)}} for image in images[:3]]}})
        assert answer.status_code == 200, answer.text
        unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
        np.testing.assert_allclose([d["score"] for d in answer.json()["data"]],
                                   unit(expected_images[:3]) @ unit(expected_texts[0]), atol=2 * TOLERANCE)
    report = json.loads((server.repository / "st_clip_image_encoder" / "verification.json").read_text())
    assert report["passed"] and report["processor"]["sentence_transformers"]["passed"]


def test_gateway_reads_local_images_only_under_the_allowed_folder(vision, tmp_path: Path) -> None:
    from pooltriton.gateway.media import MediaPolicy

    server, folders = vision
    image = photo("coffee", "RGB", "JPEG", (120, 80))
    (tmp_path / "coffee.jpg").write_bytes(image)
    expected = reference(folders["clip"], CLIPImageProcessorPil, [image])
    with gateway(server, media=MediaPolicy(local_path=tmp_path)) as http:
        answer = http.post("/v1/embeddings", json={"model": "clip", "modality": "image",
                                                  "input": [f"file://{tmp_path}/coffee.jpg"]})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["data"][0]["embedding"], expected[0], atol=TOLERANCE)
        outside = http.post("/v1/embeddings", json={"model": "clip", "modality": "image", "input": ["file:///etc/hosts"]})
        assert outside.status_code == 400 and "allowed local media path" in outside.json()["error"]["message"]


def test_the_image_stage_refuses_a_bad_request_and_serves_the_rest_of_its_batch(monkeypatch, tmp_path: Path) -> None:
    """One execute() call holding a good, a bad and a good request (as Triton's batcher hands them over): the
    bad one alone gets INVALID_ARG, the others their pixels (the stage's own code, a stand-in for the stub)."""
    import importlib
    import sys
    import types

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class TritonError:
        INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

        def __init__(self, message, code=None):
            self.message, self.code = message, code

    class Response:
        def __init__(self, tensors=(), error=None):
            self.tensors, self.error = {t.name: t.array for t in tensors}, error

    class Request:
        def __init__(self, images):
            self.inputs = {IMAGE: np.array(images, dtype=object).reshape(-1, 1)}

        def parameters(self):
            return ""

    stub = types.ModuleType("triton_python_backend_utils")
    stub.Tensor, stub.TritonError, stub.InferenceResponse = Tensor, TritonError, Response
    stub.get_input_tensor_by_name = lambda request, name: (Tensor(name, request.inputs[name])
                                                           if name in request.inputs else None)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    common = importlib.import_module("pooltriton.backends.common")
    monkeypatch.setattr(common, "pb_utils", stub)
    stage = importlib.reload(importlib.import_module("pooltriton.backends.image.model"))
    version = tmp_path / "1"
    version.mkdir()
    (version / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "CLIPImageProcessor",
                                                                  "size": {"shortest_edge": 32},
                                                                  "crop_size": {"height": 32, "width": 32}}))
    model = stage.TritonPythonModel()
    model.initialize({"model_config": json.dumps({"parameters": {}}), "model_name": "m_image_processor",
                      "model_repository": str(tmp_path), "model_version": "1"})
    good = photo("chelsea", "RGB", "PNG", (50, 40))
    answers = model.execute([Request([good]), Request([good, b"not an image"]), Request([good, good])])
    assert answers[0].error is None and answers[0].tensors["pixel_values"].shape == (1, 3, 32, 32)
    assert answers[1].error.code == "INVALID_ARG" and answers[1].error.message.startswith("image 1: not an image")
    assert answers[2].error is None and answers[2].tensors["pixel_values"].shape == (2, 3, 32, 32)
    np.testing.assert_array_equal(answers[2].tensors["pixel_values"][0], answers[0].tensors["pixel_values"][0])
