"""A small synchronous client over grpcio: streaming iterator, unary call, tokenize, model info,
health. Errors surface as TokenSelectError carrying the gRPC status code name and message."""
import dataclasses
from typing import Iterator, List, Optional, Sequence, Tuple

import grpc

from tokenselect_client import _stubs

pb, pb_grpc = _stubs.load()

_FINISH = {1: "stop", 2: "stop_string", 3: "length"}
# tokenselect.v1.SelectionPolicy by name ("" keeps the server's default).
_POLICIES = {"": 0, "tokenselect": 1, "topk": 2, "head_vote": 3, "dense": 4, "streaming": 5,
             "tokenselect_span": 6, "infllm": 7, "quest": 8, "cascade": 9}
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                    "frequency_penalty", "presence_penalty", "seed", "max_new_tokens")


class TokenSelectError(Exception):
    """A failed call: `code` is the gRPC status code name (e.g. "INVALID_ARGUMENT")."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass
class GenerateChunk:
    request_id: str
    text: str
    token_ids: List[int]
    finish_reason: Optional[str] = None  # set on the last chunk
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclasses.dataclass
class GenerateResult:
    request_id: str
    text: str
    token_ids: List[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def _error(e: grpc.RpcError) -> TokenSelectError:
    return TokenSelectError(e.code().name, e.details() or "")


class Client:
    """Connects to a router. `root_certificates` (PEM bytes) enables TLS; `api_key` is sent as
    `authorization: Bearer KEY`."""

    def __init__(self, target: str, root_certificates: Optional[bytes] = None,
                 api_key: Optional[str] = None, max_message_bytes: int = 64 << 20):
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.GenerationStub(self._channel)
        self._metadata = [("authorization", f"Bearer {api_key}")] if api_key else []

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _request(prompt=None, prompt_token_ids=None, chat: Optional[Sequence[Tuple[str, str]]] = None,
                 stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                 ignore_eos: bool = False, policy: str = "", request_id: str = "", **sampling):
        req = pb.GenerateRequest(request_id=request_id)
        if prompt_token_ids is not None:
            req.prompt_token_ids.ids.extend(prompt_token_ids)
        elif chat is not None:
            for role, content in chat:
                req.chat.messages.add(role=role, content=content)
        elif prompt is not None:
            req.prompt = prompt
        for name, value in sampling.items():
            if name not in _SAMPLING_FIELDS:
                raise TypeError(f"unknown sampling parameter {name!r}")
            if value is not None:
                setattr(req.sampling, name, value)
        req.sampling.stop.extend(stop)
        req.sampling.stop_token_ids.extend(stop_token_ids)
        req.sampling.ignore_eos = ignore_eos
        if policy not in _POLICIES:
            raise ValueError(f"policy must be one of {sorted(_POLICIES)}")
        req.selection.policy = _POLICIES[policy]
        return req

    def generate(self, prompt=None, *, timeout: Optional[float] = None,
                 **kwargs) -> Iterator[GenerateChunk]:
        """Streams the output as GenerateChunks. Breaking out of the loop (or closing the
        iterator) cancels the request on the server."""
        call = self._stub.Generate(self._request(prompt, **kwargs), timeout=timeout,
                                   metadata=self._metadata)
        try:
            for r in call:
                yield GenerateChunk(
                    request_id=r.request_id, text=r.text, token_ids=list(r.token_ids),
                    finish_reason=_FINISH.get(r.finish_reason),
                    prompt_tokens=r.usage.prompt_tokens,
                    completion_tokens=r.usage.completion_tokens)
        except grpc.RpcError as e:
            raise _error(e) from None
        finally:
            call.cancel()

    def generate_unary(self, prompt=None, *, timeout: Optional[float] = None,
                       **kwargs) -> GenerateResult:
        try:
            r = self._stub.GenerateUnary(self._request(prompt, **kwargs), timeout=timeout,
                                         metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(e) from None
        return GenerateResult(r.request_id, r.text, list(r.token_ids),
                              _FINISH.get(r.finish_reason, ""), r.usage.prompt_tokens,
                              r.usage.completion_tokens)

    def tokenize(self, text: str, timeout: Optional[float] = None) -> List[int]:
        try:
            r = self._stub.Tokenize(pb.TokenizeRequest(text=text), timeout=timeout,
                                    metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(e) from None
        return list(r.token_ids)

    def model_info(self, timeout: Optional[float] = None):
        """The ModelInfo message (model_name, architecture, vocab_size, ...)."""
        try:
            return self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout,
                                           metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(e) from None

    def wait_ready(self, timeout: float = 30.0):
        """Blocks until the channel connects (raises grpc.FutureTimeoutError otherwise)."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)
