"""A run that could serve nothing fails before any work, in one line; a run prints its layout and KV
capacity first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", "mode=sim", "progress=false", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_pool_smaller_than_every_prompt_fails_before_the_run(tmp_path):
    out = run("kv.capacity_tokens=100", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: no request can run") and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "steps.parquet").exists()


def test_a_run_prints_its_layout_and_kv_capacity(tmp_path):
    out = run("workload.num_groups=1", "workload.prompts_per_group=2", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    assert "tp=1 ep=1 dp=1 pp=1, KV capacity" in out.stdout
