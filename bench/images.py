"""Benchmark of images: the served image ensemble against an in-process baseline B, in one run.

    python bench/images.py [--size base] [--images 256] [--out bench_results]

No CLIP checkpoint installs offline, so the model is built here with seeded weights in the shape of
openai/clip-vit-base-patch32's vision tower (224 x 224 images, 12 layers of width 768; the time of a
tower does not depend on its weights) and exported by `pooltriton export` (its image tower alone).
B = the same image processor (core.images: Pillow decode, resize, crop, normalise) and the same
model.onnx on ONNX Runtime in this process, batches of 16, 2 intra-op threads. Served: tritonclient's
asyncio gRPC client, `clients` clients each sending one JPEG photograph per request. Prints images/s
and the ratio to B, and each stage's share of the server's compute time (Triton's statistics).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pooltriton.contract import ACTIVATE, ADMIN_KEY_ENV, IMAGE, PIXEL_VALUES, admin_headers, image_stages

SIZES = {  # vision tower shapes: ViT-B/32's, and a tiny one for the suite's run of this script
    "base": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
             "patch_size": 32, "image_size": 224},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "patch_size": 8, "image_size": 32},
}
BATCH = 16


def build_model(folder: Path, size: str) -> Path:
    """A CLIPModel of that vision shape (a small text tower, no tokenizer: only the image tower exports)."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    vision = SIZES[size]
    config = CLIPConfig(vision_config=vision, projection_dim=512 if size == "base" else 32,
                        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "vocab_size": 64})
    CLIPModel(config).eval().save_pretrained(folder)
    side = vision["image_size"]
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": side},
        "crop_size": {"height": side, "width": side}, "do_center_crop": True, "resample": 3}))
    return folder


def photographs(count: int) -> list[bytes]:
    """scikit-image's photographs as JPEG, at several sizes, `count` in all."""
    import skimage.data
    from PIL import Image

    photos = [skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea(), skimage.data.camera()]
    encoded = []
    for index in range(count):
        image = Image.fromarray(photos[index % len(photos)]).convert("RGB")
        scale = (1.0, 0.75, 0.5)[index // len(photos) % 3]
        image = image.resize((int(image.width * scale), int(image.height * scale)))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=90)
        encoded.append(out.getvalue())
    return encoded


def baseline(repository: Path, name: str, images: list[bytes], threads: int = 2) -> dict:
    """B: decode and preprocess with core.images, then the exported graph on ONNX Runtime, batches of 16."""
    import onnxruntime as ort

    from pooltriton.core.images import decode, read_processor

    names = image_stages(name)
    processor = read_processor(repository / names.processor / "1")
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(repository / names.encoder / "1" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    preprocess = compute = 0.0
    started = time.perf_counter()
    for start in range(0, len(images), BATCH):
        chunk = images[start:start + BATCH]
        began = time.perf_counter()
        pixels = np.stack([processor(decode(data)) for data in chunk])
        middle = time.perf_counter()
        session.run(None, {PIXEL_VALUES: pixels, ACTIVATE: np.ones((len(chunk), 1), dtype=np.int64)})
        preprocess, compute = preprocess + middle - began, compute + time.perf_counter() - middle
    seconds = time.perf_counter() - started
    return {"images_per_s": len(images) / seconds, "preprocess_share": preprocess / seconds,
            "encoder_share": compute / seconds}


async def served(grpc_url: str, name: str, images: list[bytes], clients: int) -> dict:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    queue = list(range(len(images)))

    async def one_client() -> None:
        while queue:
            data = images[queue.pop()]
            tensor = grpcclient.InferInput(IMAGE, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[data]], dtype=object))
            await client.infer(image_stages(name).ensemble, [tensor])

    try:
        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        seconds = time.perf_counter() - started
    finally:
        await client.close()
    return {"clients": clients, "images_per_s": len(images) / seconds}


def stage_shares(http_url: str, name: str, admin_key: str) -> dict[str, float]:
    """Each stage's share of the compute time Triton recorded for them (its statistics API)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url)
    names = image_stages(name)
    spent = {}
    for stage in (names.processor, names.encoder):
        stats = client.get_inference_statistics(stage, headers=admin_headers(admin_key, "http"))
        inference = stats["model_stats"][0]["inference_stats"]
        spent[stage] = sum(int(inference[key]["ns"]) for key in ("compute_input", "compute_infer", "compute_output"))
    total = sum(spent.values()) or 1
    return {stage: ns / total for stage, ns in spent.items()}


def run(out: Path, size: str, count: int, clients: tuple[int, ...]) -> dict:
    from pooltriton.export.build import ExportOptions, export_model
    from pooltriton.server.assemble import assemble
    from pooltriton.server.launcher import TritonServer

    root = Path(tempfile.mkdtemp(prefix="pooltriton-images-", dir=out))
    repository = root / "repository"
    export_model(build_model(root / "clip", size), ExportOptions(name="clip", out=repository))
    images = photographs(count)
    baseline(repository, "clip", images[:BATCH])  # warm-up
    results: dict = {"size": size, "images": count, "baseline": [baseline(repository, "clip", images)]}
    backends = assemble(Path(__file__).resolve().parent.parent / "build" / "backends")
    ports = [_port() for _ in range(3)]
    server = TritonServer(repository, backends, *ports, log_file=out / "images_server.log").start()
    try:
        server.wait_ready()
        asyncio.run(served(server.grpc_url, "clip", images[:BATCH], 4))  # warm-up
        results["served"] = [asyncio.run(served(server.grpc_url, "clip", images, c)) for c in clients]
        results["stage_shares"] = stage_shares(server.http_url, "clip", server.admin_key)
    finally:
        server.stop()
    results["baseline"].append(baseline(repository, "clip", images))  # B again: drift cancels in the mean
    shutil.rmtree(root, ignore_errors=True)
    return results


def table(results: dict) -> str:
    base = float(np.mean([b["images_per_s"] for b in results["baseline"]]))
    first = results["baseline"][0]
    rows = [f"images ({results['size']} vision tower, {results['images']} JPEG photographs, one per request)",
            f"  B (in-process, batches of {BATCH}): {base:8.1f} images/s "
            f"(preprocess {first['preprocess_share']:.0%}, encoder {first['encoder_share']:.0%})"]
    rows += [f"  served, {s['clients']:>2} clients:          {s['images_per_s']:8.1f} images/s  "
             f"{s['images_per_s'] / base:5.2f} x B" for s in results["served"]]
    shares = ", ".join(f"{stage} {share:.0%}" for stage, share in results["stage_shares"].items())
    rows.append(f"  server compute by stage: {shares}")
    return "\n".join(rows)


def _port() -> int:
    from socket import socket

    with socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/images.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--size", choices=sorted(SIZES), default="base", help="the vision tower's shape")
    parser.add_argument("--images", type=int, default=256, help="photographs per pass")
    parser.add_argument("--clients", default="1,16", help="comma-separated client counts")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop(ADMIN_KEY_ENV, None)  # the server started here makes its own key
    results = run(out, args.size, args.images, tuple(int(c) for c in args.clients.split(",")))
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    (out / "images.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"wrote {out / 'images.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
