"""Every option of every config group composes and instantiates; bad options and keys fail at
composition with the valid choices named."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

from experiments.compose import CONF_DIR, compose_config
from runtime.build import build_core
from tests.experiments.trace_files import default_traces

GROUPS = ["mode", "model", "hardware", "policy", "eviction", "workload", "costmodel", "router"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


TRACE_FORMATS = {"mooncake": "mooncake", "azure": "azure", "sharegpt": "sharegpt", "arxiv": "arxiv"}


def trace_override(option: str, tmp_path: Path) -> list[str]:
    """Trace-backed workloads read ../shared/data by default; where a checkout has no such folder,
    point them at a small trace in the same format that the test writes itself."""
    cfg = compose_config([f"workload={option}"])
    path = cfg.workload.get("path")
    if path is None or resolve_trace_path(path).exists():
        return []
    fmt = next(v for k, v in TRACE_FORMATS.items() if k in option)
    return [f"workload.path={default_traces(tmp_path)[fmt]}"]


def resolve_trace_path(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else CONF_DIR.parent / p


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_instantiates(group, option, tmp_path):
    extra = trace_override(option, tmp_path) if group == "workload" else []
    cfg = compose_config([f"{group}={option}"] + extra)
    obj = instantiate(cfg[group])
    if group == "workload":
        assert len(obj.requests()) > 0
    assert obj is not None
    if group == "router":
        assert obj(num_replicas=2).num_replicas == 2
    if group == "costmodel":
        core = build_core(cfg)
        model = obj(model=core.model, hardware=core.hardware, layout=core.layout)
        assert hasattr(model, "step_time_s")


def test_every_group_has_options():
    assert {g for g, _ in OPTIONS} == set(GROUPS)
    assert Path(CONF_DIR / "config.yaml").exists()


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["policy=lpn"])
    assert "lpm" in str(err.value) and "fcfs" in str(err.value)


@pytest.mark.parametrize("override", ["scheduler.chunked_prefil_size=10", "tpp=2", "cache.page_sise=4"])
def test_misspelled_keys_fail_at_composition(override):
    with pytest.raises(ConfigCompositionException):
        compose_config([override])


def test_mistyped_value_fails_at_composition():
    with pytest.raises(Exception, match="tp"):
        compose_config(["tp=eight"])


def test_layout_is_validated_against_the_model():
    with pytest.raises(ValueError, match="valid tp"):
        build_core(compose_config(["tp=3"]))
    core = build_core(compose_config(["model=deepseek_v3", "tp=8"]))
    assert core.layout.tp == 8 and core.kv_capacity_tokens > 100_000
