"""Every rank sets NCCL's graph mixing support from `real.nccl_graph_mixing` before NCCL reads it (its
communicators are created at their first collective), off unless the config turns it on."""
from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.distributed.app import make_tasks, node_plan
from runtime.distributed.groups import GRAPH_MIXING_ENV
from runtime.distributed.spawn import run_on_ranks


def _rank_setting(info, groups) -> str:
    return os.environ[GRAPH_MIXING_ENV]


@pytest.mark.parametrize("mixing", [False, True])
def test_a_rank_takes_the_setting_it_is_given(mixing, monkeypatch):
    monkeypatch.setenv(GRAPH_MIXING_ENV, "1" if not mixing else "0")      # the launcher's own value loses
    settings = run_on_ranks(_rank_setting, 2, timeout_s=120.0, graph_mixing=mixing)
    assert settings == ["1" if mixing else "0"] * 2


@pytest.mark.parametrize("overrides,mixing", [(["tp=2"], False), (["tp=2", "real.nccl_graph_mixing=true"], True)])
def test_mode_real_hands_every_rank_the_configs_setting(overrides, mixing, tmp_path):
    cfg = compose_config(["mode=real", "model=tiny_mla_moe", "real.device=cpu"] + overrides)
    core = build_core(cfg)
    tasks, _ = make_tasks(cfg, core, node_plan(cfg, core), mp.get_context("spawn"), tmp_path, False, None)
    assert [t.info.nccl_graph_mixing for t in tasks] == [mixing, mixing]
