# The native module; use kev.Model instead.
from typing import List, Optional, Tuple, TypedDict

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

class Engine:
    def __init__(self, options: EngineOptions) -> None: ...
    @property
    def card(self) -> str: ...
    def decide(self, bodies: List[bytes]) -> List[Tuple[int, str]]: ...
    def rows(self, body: bytes) -> Tuple[int, str]: ...
    def stats(self) -> dict[str, int]: ...
