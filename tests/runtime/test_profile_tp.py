"""mode=profile tp=2 on CPU (gloo, tiny MLA MoE model, smoke grid): the leader measures every grid point
of the one-GPU profile (but the ops table) while its peer runs the steps, into the tp2 layout's directory,
and costmodel=auto / profiled price a tp=2 run from that profile, and only a tp=2 run."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from hydra.utils import instantiate

pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.build import build_core  # noqa: E402
from runtime.profile.app import KEYS, run_profile  # noqa: E402
from sim.app import run_sim  # noqa: E402
from sim.costmodel import profile_tables  # noqa: E402
from sim.costmodel.profiled import ProfiledCostModel  # noqa: E402
from sim.costmodel.roofline import RooflineCostModel  # noqa: E402

TINY = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "progress=false",
        "kv.capacity_tokens=4096"]
PROFILE = ["mode=profile", "profile.grid=smoke"] + TINY
STEP_TABLES = ("decode", "prefill", "host", "mixed", "decode_shared")
SCALE = 1000.0        # the tp2 tables' times, multiplied: a step priced from them cannot pass for another's
SIM = ["mode=sim", "print_summary=false", "workload=random", "workload.num_requests=4", "workload.input_len=16",
       "workload.output_len=8", "workload.range_ratio=1.0"] + TINY


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """<root>/cpu/tiny_mla_moe/ (tp=1) and its tp2/ (tp=2, times x SCALE), as sim/profiles lays them
    out; <root>/measured_tp2/ the tp=2 tables as measured."""
    root = tmp_path_factory.mktemp("profiles")
    base = root / "cpu" / "tiny_mla_moe"
    run_profile(compose_config(PROFILE + [f"profile.out_dir={base}", f"profile.sections='{','.join(STEP_TABLES)}'"]))
    result = run_profile(compose_config(PROFILE + ["tp=2", f"profile.out_dir={root / 'measured_tp2'}"]))
    shutil.copytree(root / "measured_tp2", base / "tp2")
    for name in STEP_TABLES:
        path = base / "tp2" / f"{name}.csv"
        frame = pd.read_csv(path)
        for column in ("device_s", "device_min_s", "device_alone_s", "host_s", "schedule_s", "launch_s", "commit_s"):
            if column in frame:
                frame[column] *= SCALE
        frame.to_csv(path, index=False)
    return root, result


def test_tp2_profile_measures_every_grid_point_of_the_one_gpu_profile(profiles):
    root, result = profiles
    measured, one_gpu = root / "measured_tp2", root / "cpu" / "tiny_mla_moe"
    assert result["directory"] == str(measured) and "ops" not in result
    assert not (measured / "ops.csv").exists()                 # single operators: one GPU only
    idle = pd.read_csv(measured / "idle_launch.csv")          # the leader's launches after idle gaps
    assert len(idle) > 0 and (idle["launch_s"] > 0).all() and (idle["gap_s"] == 0).any()
    for name in STEP_TABLES:
        keys = list(KEYS[name])
        tp2, tp1 = pd.read_csv(measured / f"{name}.csv"), pd.read_csv(one_gpu / f"{name}.csv")
        time_column = "host_s" if name == "host" else "device_s"
        assert len(tp2) > 0 and (tp2[time_column] > 0).all(), name
        assert not tp2.duplicated(keys).any(), name
        assert sorted(map(tuple, tp2[keys].astype(str).values)) == sorted(map(tuple, tp1[keys].astype(str).values)), name
    meta = json.loads((measured / "meta.json").read_text())
    assert meta["layout"] == {"tp": 2, "ep": 1, "pp": 1}
    run = meta["runs"][-1]
    sections = ["decode", "prefill", "host", "mixed", "decode_shared", "idle_launch", "prefill_after_decode"]
    assert run["num_gpus"] == 2 and run["sections"] == sections
    after = pd.read_csv(measured / "prefill_after_decode.csv")   # the leader's prefills behind decode runs
    assert len(after) > 0 and (after[["after_decode_s", "decode_after_s"]] > 0).all().all()
    idle_points = idle.groupby(["kind", "new_tokens"]).ngroups       # one point: a row per gap
    assert run["points_measured"] == sum(len(pd.read_csv(measured / f"{n}.csv")) for n in STEP_TABLES) + idle_points \
        + len(after)


def test_auto_and_profiled_price_tp2_from_the_tp2_profile(profiles, tmp_path, monkeypatch):
    root, _ = profiles
    monkeypatch.setattr(profile_tables, "PROFILES_DIR", root)
    tp2 = run_sim(compose_config(SIM + ["tp=2", "costmodel=auto"]), out_dir=tmp_path / "tp2")
    tp1 = run_sim(compose_config(SIM + ["costmodel=auto"]), out_dir=tmp_path / "tp1")
    roofline = run_sim(compose_config(SIM + ["tp=2", "costmodel=roofline"]), out_dir=tmp_path / "roofline")
    assert tp2["costmodel"]["profile"] == str(root / "cpu" / "tiny_mla_moe" / "tp2")
    assert tp1["costmodel"]["profile"] == str(root / "cpu" / "tiny_mla_moe")
    assert tp2["costmodel"]["fallback_steps"] == {"decode": 0, "prefill": 0}
    steps = {name: pd.read_parquet(tmp_path / name / "steps.parquet") for name in ("tp2", "tp1", "roofline")}
    durations = {name: (s["end_s"] - s["start_s"]).mean() for name, s in steps.items()}
    assert durations["tp2"] > 100 * durations["tp1"] and durations["tp2"] > 100 * durations["roofline"]

    explicit = run_sim(compose_config(SIM + ["tp=2", "costmodel=profiled",
                                             f"costmodel.profile={root / 'cpu' / 'tiny_mla_moe' / 'tp2'}"]),
                       out_dir=tmp_path / "explicit")
    assert explicit["costmodel"]["profile"] == tp2["costmodel"]["profile"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "explicit" / "steps.parquet"), steps["tp2"])


def test_profiled_refuses_a_layout_its_profile_did_not_measure(profiles, monkeypatch):
    root, _ = profiles
    monkeypatch.setattr(profile_tables, "PROFILES_DIR", root)
    core = build_core(compose_config(SIM + ["tp=4"]))
    with pytest.raises(FileNotFoundError, match=r"no tp4 profile .*profiled layouts: tp1, tp2\)"):
        ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel)
    core = build_core(compose_config(SIM))                    # tp=1 handed the tp2 directory
    with pytest.raises(ValueError, match="is a tp2 profile; this run is tp1"):
        ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                          profile=str(root / "cpu" / "tiny_mla_moe" / "tp2"))
    core = build_core(compose_config(SIM + ["tp=4"]))           # auto: no tp4 profile, the roofline
    auto = instantiate(compose_config(SIM + ["tp=4"]).costmodel)
    assert isinstance(auto(model=core.model, hardware=core.hardware, layout=core.layout), RooflineCostModel)


def test_profile_refuses_layouts_it_does_not_measure():
    with pytest.raises(ValueError, match="measures one replica: dp=2"):
        run_profile(compose_config(PROFILE + ["dp=2"]))
    with pytest.raises(ValueError, match="profile.sections=ops at tp=2"):
        run_profile(compose_config(PROFILE + ["tp=2", "profile.sections=ops"]))


def test_tp2_ep2_profile_goes_to_its_layout_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(profile_tables, "PROFILES_DIR", tmp_path)
    result = run_profile(compose_config(PROFILE + ["tp=2", "ep=2", "profile.sections=decode"]))
    directory = tmp_path / "cpu" / "tiny_mla_moe" / "tp2ep2"
    assert result["directory"] == str(directory) and result["decode"] > 0
    assert json.loads((directory / "meta.json").read_text())["layout"] == {"tp": 2, "ep": 2, "pp": 1}
    assert (pd.read_csv(directory / "decode.csv")["device_s"] > 0).all()


def test_a_follower_runs_the_leaders_eager_stretch_eagerly():
    """runtime.profile.ranks.follow_steps: between the leader's EagerDecode(True) and (False) the follower's
    runner has no graphs (as eager_decode leaves the leader's), around them its own; keep-alives and the
    control words are not steps."""
    from runtime.distributed.step_channel import KEEPALIVE, STOP
    from runtime.profile.ranks import follow_steps
    from runtime.profile.timing import EagerDecode

    class Runner:
        graphs, piecewise = "decode graphs", "piecewise graphs"
        ran: list = []

        def run(self, inputs):
            self.ran.append((inputs, self.graphs, self.piecewise))

    class Channel:
        messages = iter(["s1", EagerDecode(True), KEEPALIVE, "s2", EagerDecode(True), "s3", EagerDecode(False),
                         "s4", STOP])

        def recv(self):
            return next(self.messages)

    runner = Runner()
    assert follow_steps(runner, Channel()) == {"steps": 4}
    assert runner.ran == [("s1", "decode graphs", "piecewise graphs"), ("s2", None, None), ("s3", None, None),
                          ("s4", "decode graphs", "piecewise graphs")]


def test_a_follower_takes_the_sleep_word_as_no_step():
    """SleepBeforeStep (the leader times a step with its launch hidden): the follower enqueues the sleep on its
    GPU (nothing to do on CPU) and runs the next step as usual; the word is not a step."""
    import torch

    from runtime.distributed.step_channel import STOP
    from runtime.profile.ranks import follow_steps
    from runtime.profile.timing import SleepBeforeStep

    class Runner:
        device = torch.device("cpu")
        graphs = piecewise = None
        ran: list = []

        def run(self, inputs):
            self.ran.append(inputs)

    class Channel:
        messages = iter([SleepBeforeStep(1000), "s1", SleepBeforeStep(1000), "s2", STOP])

        def recv(self):
            return next(self.messages)

    runner = Runner()
    assert follow_steps(runner, Channel()) == {"steps": 2} and runner.ran == ["s1", "s2"]
