"""Arrival-time generators (seconds) for synthetic workloads: Poisson and gamma (bursty)."""
from __future__ import annotations

import math
import zlib

import numpy as np


def rng_for(seed: int, purpose: str) -> np.random.Generator:
    """An independent, reproducible stream per purpose, so that changing (say) the request
    rate does not change the token ids drawn from the same seed."""
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, zlib.crc32(purpose.encode())])


def parse_rate(value: float | int | str) -> float:
    """A request rate in req/s as float. Accepts YAML's spellings of infinity as strings too
    (`.inf`, `+.inf`), which a Hydra command-line override passes through unparsed."""
    if isinstance(value, str) and value.strip().lower().lstrip("+") in (".inf", "inf", "infinity"):
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"request_rate must be a number of req/s or inf, got {value!r}") from None


def check_arrival_args(request_rate: float, burstiness: float = 1.0) -> None:
    """ValueError unless request_rate > 0 (inf allowed) and burstiness is finite and > 0."""
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 (inf = all at t=0), got {request_rate!r}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be finite and > 0, got {burstiness!r}")


def gamma_arrivals_s(rng: np.random.Generator, num_requests: int, request_rate: float,
                     burstiness: float = 1.0) -> np.ndarray:
    """Arrival times [num_requests] in seconds, the first at 0, as SGLang's bench_serving
    sends them: inter-arrivals ~ Gamma(shape=burstiness, mean=1/request_rate), so the
    coefficient of variation is 1/sqrt(burstiness) (burstiness 1 = Poisson).
    request_rate = inf puts every arrival at 0."""
    check_arrival_args(request_rate, burstiness)
    if math.isinf(request_rate) or num_requests == 0:
        return np.zeros(num_requests)
    gaps_s = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps_s)])
