# The native module; use kev.Model instead.
from typing import Awaitable, List, Optional, Tuple, TypedDict

__version__: str

class EngineOptions(TypedDict):
    """Every key is required (``None`` where ``kev.Model`` got nothing)."""

    model_dir: Optional[str]
    base: Optional[str]
    kev: Optional[str]
    weights: str
    precision: Optional[str]
    cache_bytes: Optional[int]
    pass_tokens: Optional[int]
    threads: Optional[int]
    truncate_state: bool
    calibration: Optional[str]
    date_facts: bool
    max_questions: Optional[int]
    max_options: Optional[int]
    max_input_tokens: Optional[int]
    max_batch_requests: Optional[int]
    max_batch_input_tokens: Optional[int]
    pin_bytes: Optional[int]
    adapters: Optional[List[Tuple[str, str]]]
    strict_models: bool
    demo: bool
    aliases: Optional[List[str]]

class Engine:
    def __init__(self, options: EngineOptions) -> None: ...
    @property
    def card(self) -> str: ...
    def decide(self, bodies: List[bytes]) -> List[Tuple[int, str]]: ...
    def rows(self, body: bytes) -> Tuple[int, str]: ...
    def stats(self) -> dict[str, int]: ...

Headers = List[Tuple[bytes, bytes]]
Reply = Tuple[int, Headers, bytes]

class ServerOptions(TypedDict):
    """Every key is required (``None`` keeps ``kev serve``'s default)."""

    queue_depth: Optional[int]
    queue_deadline_ms: Optional[int]
    long_lane: Optional[str]
    max_body: Optional[int]
    request_timeout_s: Optional[int]
    admit_permits: Optional[int]
    api_key: Optional[str]
    metrics_key: Optional[str]
    min_body_rate: Optional[int]
    pin_id_prefix: Optional[str]
    io_threads: Optional[int]

class Server:
    def __init__(self, engine: Engine, options: ServerOptions) -> None: ...
    def handle(self, method: str, target: str, headers: Headers, body: bytes) -> Reply: ...
    def handle_async(self, method: str, target: str, headers: Headers, body: bytes) -> Awaitable[Reply]: ...
    @property
    def ready(self) -> bool: ...
    def close(self) -> None: ...

def route_key(headers: Headers, body: bytes, max_body: int) -> Tuple[Optional[str], Optional[str], Optional[bytes]]: ...
def error_answer(kind: str, message: str, request_id: str) -> Reply: ...
