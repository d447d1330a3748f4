"""`pooltriton` command line: export, inspect, backends, serve."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from pooltriton.contract import ENCODER_THREADS, QUEUE_SIZE, QUEUE_TIMEOUT_MS, TOKENIZER_INSTANCES
from pooltriton.core.capabilities import AUTO
from pooltriton.core.runtimes import BF16, CPU, CUDA, FP16, FP32, INT8, RUNTIMES, TOLERANCES
from pooltriton.core.semantics import PoolingType, Task
from pooltriton.server.supervisor import CANARY_DEADLINE_S, CANARY_INTERVAL_S


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _model_args(parser: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        parser.add_argument("model", help="Hugging Face model folder (or hub id when online)")
    parser.add_argument("--task", choices=[t.value for t in Task], help="default: from the architecture")
    parser.add_argument("--pooling-type", choices=[p.value for p in PoolingType],
                        help="default: sentence-transformers metadata, else the architecture's")
    parser.add_argument("--use-activation", type=_bool, metavar="BOOL",
                        help="normalise embeddings / activate logits (default: resolved)")
    parser.add_argument("--max-length", type=int, help="token limit (default: resolved)")
    parser.add_argument("--convert", choices=["embed", "classify"],
                        help="override the task family implied by the architecture name")
    parser.add_argument("--step-tag-id", type=int, help="STEP pooling: keep positions holding this token id")
    parser.add_argument("--returned-token-ids", type=lambda t: tuple(int(x) for x in t.split(",")),
                        metavar="ID,ID", help="STEP pooling on a causal LM: the vocabulary ids to score")


def _export_options(parser: argparse.ArgumentParser) -> None:
    """How a model is exported: `export`'s options, which `serve MODEL_DIR` passes through."""
    parser.add_argument("--served-model-name", dest="served_model_names", nargs="+", type=str, default=(),
                        metavar="NAME", help="other names clients may use for the model (vLLM's and TEI's); "
                        "models sharing a name are told apart by the task a request asks for")
    parser.add_argument("--classifier-from-tokens", type=lambda t: tuple(t.split(",")), metavar="[NO,]YES",
                        help="serve a causal LM as a reranker: its one logit is the LM head's YES row minus the "
                        "NO row at the last token, or the YES row alone (vLLM's classifier_from_token; "
                        "Qwen3-Reranker: no,yes; bge-reranker-v2-gemma: Yes)")
    parser.add_argument("--score-template", metavar="TEXT",
                        help="how <name>_score presents a (query, document) pair to a reranker: a text with "
                        "{query} and {document}, e.g. the model card's prompt")
    parser.add_argument("--matryoshka-dimensions", type=lambda t: tuple(int(x) for x in t.split(",")), default=(),
                        metavar="D,D", help="embedding sizes clients may ask for (truncated, re-normalised)")
    parser.add_argument("--runtime", choices=sorted(RUNTIMES), default="onnx",
                        help="encoder runtime: ONNX model.onnx (backend onnxruntime), the same file compiled by "
                        "OpenVINO (backend openvino), or TorchScript model.pt (backend pytorch)")
    parser.add_argument("--precision", choices=[FP32, BF16, FP16, INT8, AUTO], default=FP32,
                        help="encoder precision (default fp32, the exact reference): bf16 with openvino or "
                        "torchscript on CPUs with AVX512-BF16/AMX, fp16 with torchscript on GPUs, int8 (NNCF, "
                        "embedding models) with openvino on CPUs with VNNI/AMX; auto: int8 where it meets its "
                        "bounds, else bf16 where this CPU runs it natively, else fp32 (see `pooltriton "
                        "capabilities`). A precision the CPU cannot run natively is an error")
    parser.add_argument("--tolerance", type=float, metavar="T",
                        help="verification bound against the reference in fp64: fp32 |Δ| <= 8 x its fp32 noise + "
                        f"T x (1 + max |reference|) (default {TOLERANCES[FP32]:g}); bf16/fp16 cosine mean >= 1 - T, "
                        f"min >= 1 - 4T (default {TOLERANCES[BF16]:g}); int8 cosine mean >= 1 - T, min >= 1 - 5T "
                        f"(default {TOLERANCES[INT8]:g}) and top-10 neighbours as the reference's in >= 1 - 50T")
    parser.add_argument("--device", choices=[CPU, CUDA], default=CPU,
                        help="cuda: trace on the GPU and serve from KIND_GPU instances (torchscript)")
    parser.add_argument("--batching", choices=["ragged", "buckets"], default="ragged",
                        help="ragged: encoder takes mixed lengths (Python shims); buckets: the tokenizer "
                        "pads to fixed lengths so native backends can batch them")
    parser.add_argument("--tensorrt", action="store_true",
                        help="onnx on cuda: TensorRT as the native onnxruntime backend's accelerator (fp32)")
    parser.add_argument("--encoder-threads", type=int, default=ENCODER_THREADS,
                        help="intra-op threads of the encoder")
    parser.add_argument("--tokenizer-instances", type=int, default=TOKENIZER_INSTANCES,
                        help="instances of the tokenizer stage (one more keeps refusals fast while one works)")
    parser.add_argument("--memory-budget-mb", type=int, default=0,
                        help="memory the encoder may hold at once, shared by its instances and streams (ragged "
                        "batching plans chunks within it); a text that alone needs more is refused with a 400 "
                        "(default 0: half the serving machine's memory)")
    parser.add_argument("--queue-size", type=int, default=QUEUE_SIZE,
                        help="waiting requests per batched stage; more are rejected at once (UNAVAILABLE / 503)")
    parser.add_argument("--queue-timeout-ms", type=int, default=QUEUE_TIMEOUT_MS,
                        help="a request still waiting after this is rejected (a request may ask for less)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="load pickled weights (pytorch_model.bin) where no safetensors exist: pickle can run "
                        "code when loaded, so only for models you trust")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="export a model whose config.json names its own code (auto_map); that code runs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pooltriton", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    export = sub.add_parser("export", help="export a model into a Triton model repository")
    _model_args(export)
    export.add_argument("--name", required=True, help="public ensemble name (stages get suffixes)")
    export.add_argument("--verbose", action="store_true",
                        help="also the libraries' own warnings and progress bars (torch, transformers)")
    export.add_argument("--out", default="model_repository", help="model repository folder")
    _export_options(export)

    plugin = sub.add_parser("plugin", help="serve a registered IO-processor plugin around an exported model")
    plugin.add_argument("name", help="the plugin model's name")
    plugin.add_argument("--plugin", required=True, help="the name the plugin class is registered under")
    plugin.add_argument("--module", help="module to import so the plugin registers (e.g. my_pkg.plugins)")
    plugin.add_argument("--model", required=True, help="the exported model it wraps")
    plugin.add_argument("--out", default="model_repository", help="the model repository to write into")

    sub.add_parser("capabilities", help="what this CPU and the encoder runtimes run, and what --precision "
                   "auto picks (JSON with --json)").add_argument("--json", action="store_true",
                                                                  help="print JSON instead of a table")

    inspect = sub.add_parser("inspect", help="print the resolved pooler configuration (config files only)")
    _model_args(inspect)

    defaults = sub.add_parser("defaults", help="export the default models (skips those up to date)")
    defaults.add_argument("--out", default="model_repository", help="the model repository to write into")
    defaults.add_argument("--force", action="store_true", help="re-export even when up to date")
    defaults.add_argument("--verbose", action="store_true",
                          help="also the libraries' own warnings and progress bars (torch, transformers)")
    defaults.add_argument("--device", choices=[CPU, CUDA], default=CPU,
                          help="cuda: the repository for the NGC image (onnx on KIND_GPU, buckets), made on a CPU")
    defaults.add_argument("--tensorrt", action="store_true", help="with --device cuda: TensorRT accelerator")

    backends = sub.add_parser("backends", help="assemble the Triton backend directory")
    backends.add_argument("--out", default="build/backends", help="the backend directory to write")
    backends.add_argument("--native", action="store_true",
                          help="only tokenizer/pooler/scorer/plugin, beside an image's native backends (NGC)")

    serve = sub.add_parser("serve", help="run tritonserver in the foreground (Ctrl-C stops it); with MODEL_DIRs, "
                           "export those not exported yet into --repository first, as `vllm serve` does")
    serve.add_argument("models", nargs="*", metavar="MODEL_DIR",
                       help="model folders (or hub ids when online) to export and serve; each is named after its "
                       "folder unless --name (one folder only); a second start reuses the export")
    serve.add_argument("--name", help="the served name of a single MODEL_DIR (default: its folder's name)")
    _model_args(serve, positional=False)
    _export_options(serve)
    serve.add_argument("--verbose", action="store_true",
                       help="with MODEL_DIRs: the export libraries' own warnings and progress bars too")
    serve.add_argument("--repository", default="model_repository",
                       help="the model repository to serve (pooltriton export / defaults write it)")
    serve.add_argument("--backends", default="build/backends",
                       help="the backend directory (pooltriton backends writes it)")
    # Ports default to POOLTRITON_<NAME>_PORT, so an image's health check and its command agree.
    serve.add_argument("--http-port", type=int, default=_port("HTTP", 8000),
                       help="Triton's HTTP port: KServe v2 (env POOLTRITON_HTTP_PORT)")
    serve.add_argument("--grpc-port", type=int, default=_port("GRPC", 8001),
                       help="Triton's gRPC port: KServe v2 (env POOLTRITON_GRPC_PORT)")
    serve.add_argument("--metrics-port", type=int, default=_port("METRICS", 8002),
                       help="Prometheus metrics port (env POOLTRITON_METRICS_PORT)")
    serve.add_argument("--gateway-port", type=int, default=_port("GATEWAY", 8080),
                       help="OpenAI/Cohere/vLLM HTTP gateway port (0: no gateway)")
    serve.add_argument("--canary-interval-s", type=float, default=CANARY_INTERVAL_S,
                       help="seconds between canary inferences that find wedged stages (0: none)")
    serve.add_argument("--canary-deadline-s", type=float, default=CANARY_DEADLINE_S,
                       help="a canary slower than this restarts the ensemble's stages")

    ready = sub.add_parser("ready", help="exit 0 when the local server is ready (/v2/health/ready): for health checks")
    ready.add_argument("--http-port", type=int, default=_port("HTTP", 8000),
                       help="the server's HTTP port (env POOLTRITON_HTTP_PORT)")

    return parser


def _export(args: argparse.Namespace) -> int:
    from pooltriton.export.build import export_model

    _quiet_unless_verbose(args)
    options = _options(args, name=args.name, out=Path(args.out))
    return _exported("export", args.name, lambda: export_model(_local(args.model), options))


def _options(args: argparse.Namespace, name: str, out: Path):
    """The ExportOptions the arguments give (every option of the export is an argument of its name)."""
    from pooltriton.export.build import ExportOptions

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ExportOptions) if hasattr(args, f.name)}
    return ExportOptions(**{**given, "name": name, "out": out, "served_model_names": tuple(args.served_model_names)})


def _exported(prog: str, name: str, export: Callable[[], object]) -> int:
    """Run `export` as the CLI reports it: 0; 2 for what cannot be served (a usage error); else 1 with
    one paragraph, no traceback (POOLTRITON_DEBUG=1 raises it)."""
    from pooltriton.core.resolve import ResolutionError

    try:
        export()
    except ResolutionError as error:
        print(f"pooltriton {prog}: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        if os.environ.get("POOLTRITON_DEBUG"):
            raise
        kind = "verification failed" if type(error).__name__ == "VerificationError" else type(error).__name__
        print(f"pooltriton {prog}: {kind}: {error} Nothing was written for {name!r}. "
              f"(POOLTRITON_DEBUG=1 shows the traceback.)", file=sys.stderr)
        return 1
    return 0


def _quiet_unless_verbose(args: argparse.Namespace) -> None:
    """The libraries' own chatter (warnings, progress bars) only with --verbose."""
    if not args.verbose:
        from pooltriton.export.quiet import quiet_libraries

        quiet_libraries()


def _plugin(args: argparse.Namespace) -> int:
    from pooltriton.core.resolve import ResolutionError
    from pooltriton.export.plugin import write_plugin

    try:
        print(write_plugin(args.name, args.plugin, args.module, args.model, Path(args.out)))
    except (ResolutionError, KeyError, ImportError) as error:
        print(f"pooltriton plugin: {error}", file=sys.stderr)
        return 2
    return 0


def _capabilities(args: argparse.Namespace) -> int:
    from pooltriton.core.capabilities import detect

    print(json.dumps(detect().summary(), indent=2) if args.json else detect().report())
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from pooltriton.core.resolve import resolve

    config = resolve(_local(args.model), task=args.task, pooling_type=args.pooling_type,
                     use_activation=args.use_activation, max_length=args.max_length,
                     step_tag_id=args.step_tag_id, returned_token_ids=args.returned_token_ids, convert=args.convert)
    print(json.dumps(config.to_json(), indent=2))
    return 0


def _defaults(args: argparse.Namespace) -> int:
    from pooltriton.export.defaults import build_defaults

    _quiet_unless_verbose(args)
    build_defaults(Path(args.out), force=args.force, device=args.device, tensorrt=args.tensorrt)
    return 0


def _backends(args: argparse.Namespace) -> int:
    from pooltriton.server.assemble import assemble

    print(assemble(Path(args.out), native=args.native))
    return 0


def _ready(args: argparse.Namespace) -> int:
    import tritonclient.http as httpclient

    try:
        with httpclient.InferenceServerClient(f"127.0.0.1:{args.http_port}", connection_timeout=5,
                                              network_timeout=5) as client:
            return 0 if client.is_server_ready() else 1
    except Exception as error:  # refused, reset or Triton's own error: not ready, said in one line
        print(f"pooltriton ready: not ready ({error})", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    import logging

    from pooltriton.server.assemble import assemble
    from pooltriton.server.launcher import TritonServer

    if args.models:
        code = _export_for_serve(args)
        if code:
            return code
    logging.basicConfig(level=os.environ.get("POOLTRITON_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = TritonServer(Path(args.repository), assemble(Path(args.backends)),
                          http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    gateway = None
    if args.gateway_port:
        gateway = [sys.executable, "-m", "pooltriton.gateway", "--triton", f"localhost:{args.grpc_port}",
                   "--port", str(args.gateway_port)]
    return server.run_foreground(companion=gateway, canary_interval_s=args.canary_interval_s,
                                 canary_deadline_s=args.canary_deadline_s)


def _export_for_serve(args: argparse.Namespace) -> int:
    """`serve MODEL_DIR ...`: export each folder not exported yet with these options (the stamp of
    export.defaults: a second start skips it), into --repository; 0, or export's exit code."""
    from pooltriton.export.defaults import export_unless_current

    if args.name and len(args.models) > 1:
        print("pooltriton serve: --name names a single MODEL_DIR; several are named after their folders",
              file=sys.stderr)
        return 2
    _quiet_unless_verbose(args)
    for model in args.models:
        name = args.name or served_name(model)
        options = _options(args, name=name, out=Path(args.repository))
        code = _exported(f"serve: {model}", name,
                         lambda model=model, options=options: export_unless_current(_local(model), options))
        if code:
            return code
    return 0


def served_name(model: str) -> str:
    """A folder's (or hub id's) last part as a Triton model name: letters, digits and underscores."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", Path(model.rstrip("/")).name).strip("_") or "model"


COMMANDS = {"export": _export, "plugin": _plugin, "capabilities": _capabilities, "inspect": _inspect,
            "defaults": _defaults, "backends": _backends, "ready": _ready, "serve": _serve}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"POOLTRITON_{name}_PORT", default))


def _local(model: str) -> Path:
    """A local folder as is; anything else is a hub id, fetched only where a network exists."""
    path = Path(model)
    if path.exists():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model))


if __name__ == "__main__":
    sys.exit(main())
