"""runtime.gc_pauses: collections counted by generation with their pauses, long ones logged; serving_gc
freezes the start-up objects for the run only; a real run's summary carries the account."""
from __future__ import annotations

import gc
import logging

from runtime.gc_pauses import GCPauses, serving_gc


def test_collections_are_counted_by_generation_and_timed():
    pauses = GCPauses().start()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        pauses.stop()
    summary = pauses.summary()
    assert summary["collections"]["gen0"] >= 1 and summary["collections"]["gen2"] >= 2
    assert 0 < summary["pause_max_s"] <= summary["pause_total_s"] and summary["long_pauses"] == 0
    before = dict(summary["collections"])
    gc.collect()                                        # stopped: no longer counted
    assert pauses.summary()["collections"] == before


def test_a_collection_longer_than_the_threshold_is_logged(caplog):
    pauses = GCPauses(warn_above_s=1e-12).start()
    with caplog.at_level(logging.WARNING, logger="runtime.gc_pauses"):
        try:
            gc.collect()
        finally:
            pauses.stop()
    assert pauses.long_pauses >= 1 and "garbage collection of generation 2 took" in caplog.text


def test_serving_gc_freezes_for_the_block_only():
    assert gc.get_freeze_count() == 0
    with serving_gc(GCPauses(), freeze=True) as pauses:
        assert gc.get_freeze_count() > 0 and pauses.frozen_objects > 0
    assert gc.get_freeze_count() == 0 and pauses.summary()["frozen_objects"] > 0
    with serving_gc(GCPauses(), freeze=False) as pauses:
        assert gc.get_freeze_count() == 0
    assert pauses.summary()["frozen_objects"] == 0


def test_a_real_run_reports_its_collections(tmp_path):
    import pytest
    pytest.importorskip("torch")
    from experiments.compose import compose_config
    from runtime.app import run_real

    cfg = compose_config(["mode=real", "model=tiny_mla_moe", "hardware=cpu", "progress=false", "print_summary=false",
                          "workload.num_groups=1", "workload.prompts_per_group=2", "workload.system_prompt_len=16",
                          "workload.question_len=8", "workload.output_len=4"])
    summary = run_real(cfg, out_dir=tmp_path)
    assert summary["gc"]["frozen_objects"] > 0 and set(summary["gc"]["collections"]) == {"gen0", "gen1", "gen2"}
    assert gc.get_freeze_count() == 0                   # unfrozen once the run ended
