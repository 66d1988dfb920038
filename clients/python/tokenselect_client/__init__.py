"""Python client of the tokenselect public API (tokenselect.v1.Generation).

    from tokenselect_client import Client
    with Client("localhost:50051") as client:
        for chunk in client.generate("Hello", max_new_tokens=16, temperature=0):
            print(chunk.text, end="", flush=True)
"""
from tokenselect_client.client import Client, GenerateChunk, GenerateResult, TokenSelectError

__all__ = ["Client", "GenerateChunk", "GenerateResult", "TokenSelectError"]
