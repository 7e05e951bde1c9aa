"""The cache layer stays torch-free and clock-free: no forbidden imports in runtime/core/cache."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

CACHE_DIR = Path(__file__).resolve().parents[3] / "runtime" / "core" / "cache"
FORBIDDEN = {"torch", "simpy", "time", "datetime"}


@pytest.mark.parametrize("path", sorted(CACHE_DIR.rglob("*.py")), ids=lambda p: p.name)
def test_no_forbidden_imports(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        else:
            continue
        assert not roots & FORBIDDEN, f"{path.name} imports {roots & FORBIDDEN}"
