"""Request specs for router tests."""
from __future__ import annotations

from runtime.core.request import RequestSpec


def spec(rid: str, input_ids, arrival_s: float = 0.0) -> RequestSpec:
    return RequestSpec(rid=rid, arrival_s=arrival_s, input_ids=tuple(input_ids), output_len=4)


def distinct(i: int, length: int = 64) -> RequestSpec:
    """A request sharing no token with any other `distinct(j)`."""
    return spec(f"d{i}", range(100_000 * (i + 1), 100_000 * (i + 1) + length))
