"""Every run writes its PNGs and a report.md linking them; empty runs and broken frames never fail
the run."""
from __future__ import annotations

import re

import pandas as pd

from experiments.compose import compose_config
from experiments.plots import LATENCY_PNG, STEPS_PNG, TIMELINE_PNG, plot_run, write_run_plots
from runtime.core.records import REQUEST_COLUMNS, STEP_COLUMNS
from runtime.records_io import write_run
from sim.app import run_sim

SMALL = ["progress=false", "print_summary=false", "workload.num_groups=2", "workload.prompts_per_group=4",
         "workload.system_prompt_len=256", "workload.question_len=16", "workload.output_len=8"]
PNGS = (LATENCY_PNG, TIMELINE_PNG, STEPS_PNG)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_sim_run_writes_its_pngs_and_report(tmp_path):
    summary = run_sim(compose_config(SMALL), out_dir=tmp_path)
    for name in PNGS:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000
    report = (tmp_path / "report.md").read_text()
    assert set(re.findall(r"\]\(([\w.]+\.png)\)", report)) == set(PNGS)
    assert f"{summary['num_requests']} ({summary['num_finished']} / 0)" in report
    assert f"| KV capacity (tokens) | {summary['kv_capacity_tokens']} |" in report


def test_empty_frames_still_give_figures(tmp_path):
    requests = pd.DataFrame(columns=list(REQUEST_COLUMNS))
    steps = pd.DataFrame(columns=list(STEP_COLUMNS))
    summary = {"mode": "sim", "num_requests": 0, "ttft_s": {"p50": None, "p99": None}}
    written = write_run_plots(tmp_path, requests, steps, summary)
    assert sorted(p.name for p in written) == sorted(PNGS + ("report.md",))
    assert "| TTFT p50 / p99 (ms) | – / – |" in (tmp_path / "report.md").read_text()


def test_a_drawing_failure_warns_and_keeps_the_records(tmp_path, capsys):
    requests = pd.DataFrame(columns=list(REQUEST_COLUMNS))
    broken_steps = pd.DataFrame({"step_id": [0]})          # columns missing: drawing fails
    assert plot_run(tmp_path, requests, broken_steps, {"mode": "sim"}) == []
    assert capsys.readouterr().err.startswith("warning: run plots not written")
    write_run(tmp_path, requests, broken_steps, {"mode": "sim"})
    assert (tmp_path / "summary.json").exists() and (tmp_path / "steps.parquet").exists()


def test_plots_can_be_turned_off(tmp_path):
    write_run(tmp_path, pd.DataFrame(columns=list(REQUEST_COLUMNS)), pd.DataFrame(columns=list(STEP_COLUMNS)),
              {"mode": "sim"}, plots=False)
    assert not list(tmp_path.glob("*.png")) and not (tmp_path / "report.md").exists()


def test_dp_replicas_some_idle_still_give_figures(tmp_path, capsys):
    run_sim(compose_config(SMALL + ["dp=4", "workload.num_groups=1", "workload.prompts_per_group=2"]), out_dir=tmp_path)
    assert "warning" not in capsys.readouterr().err
    for name in PNGS:
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


def test_object_columns_are_drawn_as_numbers(tmp_path, capsys):
    summary = run_sim(compose_config(SMALL), out_dir=tmp_path)
    requests, steps = pd.read_parquet(tmp_path / "requests.parquet"), pd.read_parquet(tmp_path / "steps.parquet")
    assert len(plot_run(tmp_path, requests.astype(object), steps.astype(object), summary)) == 4
    assert "warning" not in capsys.readouterr().err
