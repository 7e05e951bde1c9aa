"""Session fixtures: per family, a tiny HF model, its safetensors checkpoint, and ours loaded from it."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from runtime.models.base import CausalLM
from runtime.models.loader import build_model
from tests.models.hf_models import FAMILIES, make_hf_model, save_hf_model


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny ops on shared CPU cores: intra-op threads only spin against other processes (4x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@dataclass
class Pair:
    family: str
    hf: torch.nn.Module
    ours: CausalLM
    path: Path


@pytest.fixture(scope="session", params=FAMILIES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    family = request.param
    with one_thread():
        hf = make_hf_model(family)
        path = save_hf_model(hf, tmp_path_factory.mktemp(family))
        ours = build_model(None, torch.float32, "cpu", load_format="safetensors", path=path)
    return Pair(family, hf, ours, path)
