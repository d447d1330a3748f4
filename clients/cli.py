"""`pooltriton-client`: call the served models and print JSON."""

from __future__ import annotations

import argparse
import json
import sys

from pooltriton.clients.triton import PoolingClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pooltriton-client", description=__doc__)
    parser.add_argument("--url", help="server address (default localhost:8000 http / localhost:8001 grpc)")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    sub = parser.add_subparsers(dest="command", required=True)
    embed = sub.add_parser("embed", help="embed texts (arguments, or one per line on stdin)")
    embed.add_argument("texts", nargs="*")
    embed.add_argument("--model", default="minilm")
    embed.add_argument("--truncate", choices=["NONE", "END", "START"])
    embed.add_argument("--no-activation", action="store_true", help="return unnormalised vectors")
    args = parser.parse_args(argv)

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    with PoolingClient(args.url, protocol=args.protocol, model=args.model) as client:
        vectors = client.embed(texts, truncate=args.truncate,
                               use_activation=False if args.no_activation else None)
    json.dump({"model": args.model, "data": [{"index": i, "embedding": v.tolist()}
                                              for i, v in enumerate(vectors)]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
