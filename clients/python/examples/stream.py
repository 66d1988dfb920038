#!/usr/bin/env python3
"""Streams one completion from a tokenselect router.

    build/bin/tokenselect serve --all-in-one --port 50051 &
    PYTHONPATH=clients/python python3 clients/python/examples/stream.py \
        --server localhost:50051 --prompt "Long-context inference"
"""
import argparse
import sys

from tokenselect_client import Client, TokenSelectError


def main():
    parser = argparse.ArgumentParser(description="stream a completion")
    parser.add_argument("--server", default="localhost:50051")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--api_key", default=None)
    args = parser.parse_args()
    with Client(args.server, api_key=args.api_key) as client:
        try:
            for chunk in client.generate(args.prompt, max_new_tokens=args.max_new_tokens,
                                         temperature=args.temperature, timeout=60):
                print(chunk.text, end="", flush=True)
                if chunk.finish_reason:
                    print(f"\n[finish={chunk.finish_reason} prompt={chunk.prompt_tokens} "
                          f"generated={chunk.completion_tokens}]", file=sys.stderr)
        except TokenSelectError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
