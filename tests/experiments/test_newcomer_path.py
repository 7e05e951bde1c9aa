"""What a new user meets first: bad inputs end `python run.py` with one line naming the problem
(status 2), `inf` rates work on the command line, and the speed bench leaves committed files alone."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from experiments import bench_sim_speed
from experiments.compose import compose_config
from experiments.workloads.arrivals import parse_rate

REPO = Path(__file__).resolve().parents[2]
TINY = ["mode=sim", "progress=false", "workload=random", "workload.num_requests=3", "workload.input_len=32",
        "workload.range_ratio=1.0",
        "workload.output_len=2"]


def run_py(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args, f"hydra.run.dir={tmp_path}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("override,names", [
    ("tp=3", "tp=3"),
    ("workload.request_rate=-1", "request_rate"),
    ("kv.capacity_tokens=16", "KV pool holds 16 (kv.capacity_tokens)"),
])
def test_bad_input_exits_with_one_line(override, names, tmp_path):
    done = run_py([*TINY, override], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], done.stderr


def test_missing_trace_names_the_file_and_the_option(tmp_path):
    done = run_py(["mode=sim", "progress=false", "workload=mooncake", f"workload.path={tmp_path}/none.jsonl"], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert "none.jsonl" in lines[0] and "workload.path=" in lines[0]


def test_full_error_shows_the_traceback(tmp_path):
    done = run_py([*TINY, "tp=3"], tmp_path, HYDRA_FULL_ERROR="1")
    assert done.returncode != 0 and "Traceback" in done.stderr and "LayoutError" in done.stderr


@pytest.mark.parametrize("spelling", ["inf", ".inf", "+.inf", "Infinity"])
def test_infinite_rate_on_the_command_line(spelling):
    assert parse_rate(spelling) == math.inf
    cfg = compose_config(TINY + [f"workload.request_rate={spelling}"])
    specs = instantiate(cfg.workload).requests()
    assert [s.arrival_s for s in specs] == [0.0, 0.0, 0.0]


def test_rate_parsing_rejects_words():
    assert parse_rate("2.5") == 2.5 and parse_rate(4) == 4.0
    with pytest.raises(ValueError, match="request_rate"):
        parse_rate("fast")


def test_speed_bench_writes_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    small = ["workload=shared_prefix", "workload.num_groups=1", "workload.prompts_per_group=2",
             "workload.system_prompt_len=16", "workload.output_len=2"]
    monkeypatch.setattr(sys, "argv", ["bench_sim_speed.py", *small])
    bench_sim_speed.main()
    assert "speedup_sim_loop" in capsys.readouterr().out
    assert not (tmp_path / bench_sim_speed.RESULTS_CSV).exists()
    monkeypatch.setattr(sys, "argv", ["bench_sim_speed.py", "--write", *small])
    bench_sim_speed.main()
    assert (tmp_path / bench_sim_speed.RESULTS_CSV).read_text().count("\n") == 2   # header + row
