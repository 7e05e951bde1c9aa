"""DESIGN contract 1: runtime/core imports neither torch, simpy nor time (nor reads a clock)."""
from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import runtime.core

CORE = Path(runtime.core.__file__).parent
FORBIDDEN = {"torch", "simpy", "time", "datetime", "triton"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_core_file_imports_torch_simpy_or_a_clock():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 20
    offenders = {str(f.relative_to(CORE)): sorted(_imported_roots(f) & FORBIDDEN) for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_all_of_core_loads_neither_torch_nor_simpy():
    modules = [m.name for m in pkgutil.walk_packages([str(CORE)], prefix="runtime.core.")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(k for k in ('torch', 'simpy', 'triton') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=CORE.parent.parent)
    assert out.stdout.strip() == "[]"
