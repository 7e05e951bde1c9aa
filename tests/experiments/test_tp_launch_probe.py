"""experiments/tp_launch_probe.py on CPU at tp=2 (gloo, the tiny MLA model): both ranks time every launch, the
leader's rows carry each regime, the peer's rows line up with the leader's launches one for one, and the hand-off
and the parts fit inside the launch."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

import tp_launch_probe  # noqa: E402


def test_both_ranks_time_every_launch(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert tp_launch_probe.main(["--out", str(out), "--tokens", "48", "--decode-batch", "2", "--context", "32",
                                 "--steps", "2", "model=tiny_mla_moe", "hardware=cpu", "tp=2"]) == 0
    result = json.loads(out.read_text())
    leader, follower = result["leader"]["rows"], result["follower"]["rows"]
    regimes = {(r["step"], r["regime"]) for r in leader}
    assert {("prefill_48", "back_to_back"), ("prefill_48", "idle"), ("prefill_48", "after_decode"),
            ("decode_b2", "idle"), ("decode_ahead", "ahead")} <= regimes
    assert [r["seq"] for r in follower] == list(range(len(follower)))    # every launch (warm-ups too) ran on the
    assert len(follower) == 1 + max(r["seq"] for r in leader)            # peer once, in the leader's order
    tokens = {"prefill_48": 48, "decode_b2": 2, "decode_ahead": 8}
    for lead in leader:
        peer = follower[lead["seq"]]
        assert peer["tokens"] == tokens[lead["step"]]
        assert lead["send_ms"] > 0 and peer["recv_ms"] > 0
        assert lead["send_ms"] + lead["prepare_ms"] + lead["to_device_ms"] <= lead["launch_ms"]
    assert "prefill_48    after_decode" in capsys.readouterr().out
