import os
from typing import Any, Iterable, List, Literal, Mapping, Optional, Tuple, Union

__all__ = ["Model", "Server", "ContractError", "KevError", "Request", "__version__"]
__version__: str

Request = Union[Mapping[str, Any], str, bytes, bytearray, memoryview]
_Path = Union[str, os.PathLike[str]]

class ContractError(ValueError):
    """A request the server would refuse."""

    status: int
    """422 (or 400), as the server would answer."""
    body: Any
    """The error body the server would send (FastAPI-style ``{"detail": …}``)."""
    def __init__(self, status: int, body: Any) -> None: ...

class KevError(RuntimeError):
    """A failure of ours on an accepted request (the server would answer 500)."""

class Model:
    """A Kev model loaded in this process (see the package README for the knobs)."""

    def __init__(
        self,
        model_dir: Optional[_Path] = None,
        base: Optional[_Path] = None,
        kev: Optional[_Path] = None,
        weights: Literal["merged", "exact"] = "merged",
        precision: Optional[Literal["fp32", "bf16", "int8"]] = None,
        cache_bytes: Optional[int] = None,
        *,
        pass_tokens: Optional[int] = None,
        threads: Optional[int] = None,
        truncate_state: bool = False,
        calibration: Optional[_Path] = None,
        date_facts: bool = False,
        max_questions: Optional[int] = None,
        max_options: Optional[int] = None,
        max_input_tokens: Optional[int] = None,
        adapters: Optional[Mapping[str, _Path]] = None,
        default_adapter: Optional[str] = None,
        strict_models: bool = False,
        demo: bool = False,
        aliases: Optional[Iterable[str]] = None,
        pin_bytes: Optional[int] = None,
        max_batch_requests: Optional[int] = None,
        max_batch_input_tokens: Optional[int] = None,
        release: Optional[Literal["kev-4b", "kev-0.8b", "kev-9b"]] = None,
    ) -> None: ...
    def server(
        self,
        *,
        queue_depth: Optional[int] = None,
        queue_deadline_ms: Optional[int] = None,
        long_lane: Optional[Literal["on", "low", "off"]] = None,
        max_body: Optional[int] = None,
        request_timeout_s: Optional[int] = None,
        admit_permits: Optional[int] = None,
        api_key: Optional[str] = None,
        metrics_key: Optional[str] = None,
        min_body_rate: Optional[int] = None,
        pin_id_prefix: Optional[str] = None,
        io_threads: Optional[int] = None,
    ) -> "Server":
        """``kev serve`` in this process over this model (see :class:`Server`)."""
    @property
    def info(self) -> dict[str, Any]:
        """The ``/v1/models`` card: ``name``, ``description``, ``release_date`` and the ``x_…`` fields."""
    @property
    def stats(self) -> dict[str, int]:
        """``rows``, ``passes``, ``cache_hits``, ``cache_misses``, ``cache_bytes`` since load."""
    def decide(self, request: Request) -> dict[str, Any]:
        """The response body ``POST /v1/systemone`` returns; raises ``ContractError`` or ``KevError``."""
    def decide_many(
        self,
        requests: Iterable[Request],
        *,
        progress: bool = False,
        errors: Literal["inline", "raise"] = "inline",
    ) -> List[dict[str, Any]]:
        """Many requests through shared passes, GIL released; refusals inline as ``{"status", "body"}``."""
    def decide_jsonl(self, requests: Iterable[Request], *, progress: bool = False) -> List[str]:
        """Per request the exact line ``kev decide --jsonl`` writes."""
    def rows(self, request: Request) -> dict[str, Any]:
        """What the request compiles to (``kev rows``); raises ``ContractError``."""

Headers = List[Tuple[bytes, bytes]]

class Server:
    """``kev serve`` in-process: kev-server's application over a loaded model, answering requests handed to it."""

    model: Model
    def __init__(
        self,
        model: Model,
        *,
        queue_depth: Optional[int] = None,
        queue_deadline_ms: Optional[int] = None,
        long_lane: Optional[Literal["on", "low", "off"]] = None,
        max_body: Optional[int] = None,
        request_timeout_s: Optional[int] = None,
        admit_permits: Optional[int] = None,
        api_key: Optional[str] = None,
        metrics_key: Optional[str] = None,
        min_body_rate: Optional[int] = None,
        pin_id_prefix: Optional[str] = None,
        io_threads: Optional[int] = None,
    ) -> None: ...
    def handle(
        self, method: str, target: str, headers: Iterable[Tuple[bytes, bytes]] = ..., body: bytes = ...
    ) -> Tuple[int, Headers, bytes]:
        """``(status, headers, body)`` as ``kev serve`` sends them (less ``date`` and ``content-length``)."""
    async def handle_async(
        self, method: str, target: str, headers: Iterable[Tuple[bytes, bytes]] = ..., body: bytes = ...
    ) -> Tuple[int, Headers, bytes]:
        """:meth:`handle` as an asyncio coroutine; cancelling it stops the request."""
    @property
    def ready(self) -> bool: ...
    def close(self) -> None: ...
