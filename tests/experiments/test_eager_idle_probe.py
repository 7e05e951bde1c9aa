"""experiments.eager_idle_probe on the tiny CPU model: every trial serves the warm token count, a count never
served before and the warm one again, after its gap; every gap gets its rounds; the CSV holds one row per step."""
from __future__ import annotations

import pandas as pd

from experiments.eager_idle_probe import main


def test_each_gap_gets_its_rounds_of_warm_new_warm(tmp_path):
    out = tmp_path / "idle.csv"
    assert main(["--gaps", "0", "0.01", "--rounds", "2", "--warm-tokens", "48", "--first-new-tokens", "20",
                 "--out", str(out), "model=tiny_mla_moe", "hardware=cpu"]) == 0
    rows = pd.read_csv(out)
    assert len(rows) == 2 * 2 * 3
    assert sorted(rows.groupby("trial")["gap_s"].first().tolist()) == [0.0, 0.0, 0.01, 0.01]
    for _, trial in rows.groupby("trial"):
        assert trial.sort_values("order")["kind"].tolist() == ["warm", "new", "warm_again"]
        assert trial.loc[trial["kind"] != "new", "tokens"].eq(48).all()
    new = rows.loc[rows["kind"] == "new", "tokens"]
    assert new.is_unique and new.min() == 20                     # a count never served before, every trial
    assert (rows["interval_ms"] > 0).all()
