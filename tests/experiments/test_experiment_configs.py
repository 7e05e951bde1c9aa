"""Every experiment config (conf/experiment/) composes with each value of each swept key, builds
its core components and workload, and runs through Hydra's joblib launcher."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from experiments.compose import CONF_DIR, compose_config
from runtime.build import build_core
from runtime.config_schema import register_schemas
from tests.experiments.trace_files import default_traces

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
TRACE_FORMATS = {"mooncake": "mooncake", "sharegpt": "sharegpt", "azure": "azure", "arxiv": "arxiv"}


def hydra_node(experiment: str):
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[f"+experiment={experiment}"], return_hydra_config=True).hydra


def swept_jobs(experiment: str) -> list[list[str]]:
    """For every value of every swept key, one job's overrides: that value, and the first value
    of each other swept key (`policy=lpm`, `kv.capacity_tokens=null`, ...)."""
    params = {k: [v.strip() for v in str(vs).split(",")] for k, vs in hydra_node(experiment).sweeper.params.items()}
    firsts = {k: f"{k}={vs[0]}" for k, vs in params.items()}
    return [[*{**firsts, key: f"{key}={value}"}.values()] for key, values in params.items() for value in values]


def with_trace(overrides: list[str], tmp_path: Path) -> list[str]:
    """Point a trace workload at a small self-written trace where ../shared/data is absent."""
    cfg = compose_config(overrides)
    path = cfg.workload.get("path")
    if path is None or (CONF_DIR.parent / path).exists() or Path(path).exists():
        return overrides
    fmt = next(v for k, v in TRACE_FORMATS.items() if k in cfg.workload._target_.lower())
    return overrides + [f"workload.path={default_traces(tmp_path)[fmt]}"]


def test_there_are_studies():
    assert {"policy_study", "eviction_study", "layout_study"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_sweeps_with_the_joblib_launcher(experiment):
    node = hydra_node(experiment)
    assert "joblib" in node.launcher._target_.lower()
    assert len(node.sweeper.params) >= 1


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_swept_value_composes_and_builds(experiment, tmp_path):
    base = with_trace([f"+experiment={experiment}"], tmp_path)
    assert len(instantiate(compose_config(base).workload).requests()) > 0
    for job in swept_jobs(experiment):
        cfg = compose_config(base + job)
        for key, value in (o.split("=", 1) for o in job):
            if key in cfg and isinstance(cfg[key], (int, float)):
                assert str(cfg[key]) == value
        core = build_core(cfg)
        assert core.kv_capacity_tokens > 0


LAYOUT_PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment" / "layout").glob("*.yaml"))


@pytest.mark.parametrize("preset", LAYOUT_PRESETS)
def test_every_layout_preset_builds_for_deepseek_v3(preset):
    cfg = compose_config(["+experiment=layout_study", f"+experiment/layout={preset}"])
    layout = build_core(cfg).layout
    assert 8 <= layout.num_gpus <= 64 and layout.num_gpus % 8 == 0
    assert f"tp{layout.tp}" in preset and (f"ep{layout.ep}" in preset) == (layout.ep > 1)
    assert (f"dpattn{layout.dp}" in preset) == layout.dp_attention
    assert preset.startswith(f"dp{layout.dp}_") == (layout.dp > 1 and not layout.dp_attention)
