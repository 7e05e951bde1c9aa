"""`python run.py` with a layout the model or GPU cannot take prints one line naming the numbers
and exits with status 2, without a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides,expected", [
    (["tp=3"], "error: tp=3 does not divide num_attention_heads=16 of deepseek_v2_lite; valid tp: 1, 2, 4, 8, 16"),
    (["model=deepseek_v3", "tp=2"], "error: deepseek_v3 weights (float8) need 337.1 GB per GPU with tp=2"),
])
def test_layout_error_is_one_line_without_traceback(tmp_path, overrides, expected) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *overrides, f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
