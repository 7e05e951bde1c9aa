"""A dead rank stops a multi-process run with one line naming it, and nothing is left running: neither
when a rank is killed mid-run, nor when the launching process itself is killed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
LONG_RUN = ["mode=real", "model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "tp=2",
            "progress=false", "workload.num_groups=2", "workload.prompts_per_group=4", "workload.system_prompt_len=32",
            "workload.question_len=8", "workload.output_len=1500"]


def launch(tmp_path: Path, run_args: list[str] = LONG_RUN) -> tuple[subprocess.Popen, dict[int, int]]:
    """`python run.py *run_args` in the background, once every rank is ready: (process, rank -> pid)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "run.py", *run_args, f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = tmp_path / "ranks.json"
    deadline = time.monotonic() + 120
    while not ranks.exists():                          # written once every rank has built its runner
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run never got ready: {proc.communicate()[1][-2000:]}")
        time.sleep(0.2)
    return proc, {int(r): pid for r, pid in json.loads(ranks.read_text()).items()}


def gone(pids, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def kill_rank(proc: subprocess.Popen, pids: dict[int, int], rank: int) -> str:
    """SIGKILL `rank` of a serving run; the run must end with status 2 and one error line, returned."""
    time.sleep(1.0)                                     # serving by now
    os.kill(pids[rank], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr[-2000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, stderr[-2000:]
    return lines[0]


def test_a_killed_rank_stops_the_run_naming_it(tmp_path):
    proc, pids = launch(tmp_path)
    line = kill_rank(proc, pids, 1)
    assert "rank 1 of 2" in line and "killed by SIGKILL" in line and f"pid {pids[1]}" in line
    assert gone(pids.values())


def test_ranks_die_with_their_launcher(tmp_path):
    proc, pids = launch(tmp_path)
    proc.kill()                                         # no clean-up code runs in the launcher
    proc.communicate(timeout=30)
    assert gone(pids.values())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
