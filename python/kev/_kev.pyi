# The native module; use kev.Model instead.
from typing import List, Optional, Tuple

__version__: str

class Engine:
    def __init__(
        self,
        model_dir: Optional[str] = None,
        base: Optional[str] = None,
        kev: Optional[str] = None,
        weights: str = "merged",
        precision: Optional[str] = None,
        cache_bytes: Optional[int] = None,
        pass_tokens: Optional[int] = None,
        threads: Optional[int] = None,
        truncate_state: bool = False,
    ) -> None: ...
    @property
    def card(self) -> str: ...
    def decide(self, bodies: List[bytes]) -> List[Tuple[int, str]]: ...
    def rows(self, body: bytes) -> Tuple[int, str]: ...
    def stats(self) -> dict[str, int]: ...
