"""Finds (or generates) the protobuf/gRPC stubs of proto/tokenselect/v1.

Search order: $TOKENSELECT_STUBS_DIR; the package's _generated/ directory (setup.py build);
modules already importable (e.g. a build tree on PYTHONPATH); else they are generated into
~/.cache/tokenselect/python_stubs from the repository's protos (needs protoc).
"""
import importlib
import os
import sys


def _try_import():
    try:
        generate_pb2 = importlib.import_module("proto.tokenselect.v1.generate_pb2")
        generate_pb2_grpc = importlib.import_module("proto.tokenselect.v1.generate_pb2_grpc")
        return generate_pb2, generate_pb2_grpc
    except ImportError:
        return None


def load():
    candidates = []
    if os.environ.get("TOKENSELECT_STUBS_DIR"):
        candidates.append(os.environ["TOKENSELECT_STUBS_DIR"])
    candidates.append(os.path.join(os.path.dirname(__file__), "_generated"))
    for path in candidates:
        if os.path.isdir(os.path.join(path, "proto")) and path not in sys.path:
            sys.path.insert(0, path)
    found = _try_import()
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    import build_stubs  # clients/python/build_stubs.py, next to the package in the source tree

    cache = os.path.join(os.path.expanduser("~"), ".cache", "tokenselect", "python_stubs")
    build_stubs.build(cache)
    sys.path.insert(0, cache)
    found = _try_import()
    if not found:
        raise ImportError("cannot import or generate the tokenselect.v1 stubs")
    return found
