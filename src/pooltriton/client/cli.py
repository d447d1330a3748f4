"""`pooltriton-client`: call the served models and print JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tritonclient.utils import InferenceServerException

from pooltriton.client.triton import PoolingClient


def _texts(args: argparse.Namespace) -> list[str]:
    return args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pooltriton-client", description=__doc__)
    parser.add_argument("--url", help="server address (default localhost:8000 http / localhost:8001 grpc)")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http", help="KServe v2 over HTTP or gRPC")
    parser.add_argument("--timeout-s", type=float, help="each inference's deadline, retries included; also "
                        "sent to Triton as the request's timeout (a stage drops work queued past it)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("embed", "embed texts"), ("classify", "class probabilities per text"),
                            ("encode", "any task's raw output (token tasks: one list per text)")):
        command = sub.add_parser(name, help=f"{help_text} (arguments, or one per line on stdin)")
        command.add_argument("texts", nargs="*", help="the texts (none: one per line on stdin)")
        command.add_argument("--model", default="minilm", help="the served model's name")
        command.add_argument("--truncate", choices=["NONE", "END", "START"],
                             help="cut texts past the model's limit at that side (NONE: refuse them)")
        command.add_argument("--no-activation", action="store_true", help="raw vectors / logits")
    tokenize = sub.add_parser("tokenize", help="token ids per text from the model's own tokenizer stage")
    tokenize.add_argument("texts", nargs="*", help="the texts (none: one per line on stdin)")
    tokenize.add_argument("--model", default="minilm", help="the served model's name")
    for name in ("score", "rerank"):
        command = sub.add_parser(name, help=f"{name} documents against a query with <model>_score")
        command.add_argument("query", help="the query text")
        command.add_argument("documents", nargs="+", help="the documents to score against it")
        command.add_argument("--model", default="minilm", help="the served model's name")
        command.add_argument("--top-n", type=int, help="rerank: keep the best N")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout_s is not None and args.timeout_s <= 0:
        parser.error("--timeout-s must be positive")
    try:
        output = _run(args)
    except (ValueError, InferenceServerException) as error:
        print(f"pooltriton-client: {error}", file=sys.stderr)
        return 2
    try:
        json.dump({"model": args.model, **output}, sys.stdout)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`| head`): end quietly. Python's recipe: stdout to devnull, or the flush at
        # exit reports the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _run(args: argparse.Namespace) -> dict:
    with PoolingClient(args.url, protocol=args.protocol, model=args.model, timeout_s=args.timeout_s) as client:
        if args.command in ("embed", "classify", "encode"):
            options = {"truncate": args.truncate, "use_activation": False if args.no_activation else None}
            texts = _texts(args)
            if args.command == "embed":
                vectors = client.embed(texts, **options)
                output = {"data": [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}
            elif args.command == "classify":
                result = client.classify(texts, **options)
                output = {"data": [{"index": i, "label": label, "probs": p.tolist()}
                                   for i, ((label, _), p) in enumerate(zip(result.top(), result.probabilities))],
                          "labels": list(result.labels)}
            else:
                values = client.encode(texts, **options)
                output = {"data": [{"index": i, "data": v.tolist()} for i, v in enumerate(values)]}
        elif args.command == "tokenize":
            output = {"data": [{"index": i, "tokens": ids} for i, ids in enumerate(client.tokenize(_texts(args)))]}
        elif args.command == "score":
            scores = client.score(args.query, args.documents)
            output = {"data": [{"index": i, "score": float(s)} for i, s in enumerate(scores)]}
        else:
            results = client.rerank(args.query, args.documents, top_n=args.top_n)
            output = {"results": [{"index": r.index, "relevance_score": r.score, "document": r.document}
                                  for r in results]}
    return output


if __name__ == "__main__":
    sys.exit(main())
