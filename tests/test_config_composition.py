"""Every option of every config group composes and instantiates; bad options and keys fail at
composition with the valid choices named."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

from experiments.compose import CONF_DIR, compose_config
from runtime.build import build_core

GROUPS = ["mode", "model", "hardware", "policy", "eviction", "workload", "costmodel"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_instantiates(group, option):
    cfg = compose_config([f"{group}={option}"])
    obj = instantiate(cfg[group])
    assert obj is not None
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
