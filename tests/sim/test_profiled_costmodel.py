"""costmodel=profiled on a small committed profile (tests/sim/data/profile_small, formula values): exact
at grid points, monotone between them, graph vs eager by the graph limit, roofline fallback (scaled at
the grid edge, counted) outside the grid; costmodel=auto picks it only where a profile applies."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate

from experiments.compose import compose_config
from runtime.build import build_core
from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.profile_tables import Curve, capture_batch_sizes
from sim.costmodel.profiled import ProfiledCostModel
from sim.costmodel.roofline import RooflineCostModel

SMALL = Path(__file__).parent / "data" / "profile_small"
TINY = ["model=tiny_mla_moe", "hardware=cpu"]


def small_model(**kw) -> ProfiledCostModel:
    core = build_core(compose_config(TINY))
    return ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                             profile=str(SMALL), **kw)


def table(name: str) -> pd.DataFrame:
    return pd.read_csv(SMALL / f"{name}.csv")


def decode(model: ProfiledCostModel, batch: int, context_each: float) -> float:
    return model.device_time_s(StepShape(num_decode_reqs=batch, decode_context_tokens=int(batch * context_each)))


def test_grid_points_are_the_measurements():
    model = small_model()
    rows = table("decode")
    for r in rows[rows["path"] == "graph"].itertuples():
        assert decode(model, r.batch_size, r.context_tokens) == pytest.approx(r.device_s, rel=1e-9)
    rows = table("prefill")
    for r in rows[rows["num_seqs"] == 1].itertuples():
        shape = StepShape((r.new_tokens,), (r.prefix_tokens,))
        assert model.device_time_s(shape) == pytest.approx(r.device_s, rel=1e-9)
    for r in rows[rows["num_seqs"] == 4].itertuples():        # the multi-sequence correction reproduces them
        each = r.new_tokens // 4
        shape = StepShape((each,) * 4, (r.prefix_tokens,) * 4)
        assert model.device_time_s(shape) == pytest.approx(r.device_s, rel=1e-9)
    assert model.fallbacks == {"decode": 0, "prefill": 0}


def test_interpolation_is_monotone_in_each_dimension():
    model = small_model()
    contexts = np.linspace(16, 256, 41)
    for batch in (1, 2, 3, 4, 9, 16):
        times = [decode(model, batch, c) for c in contexts]
        assert np.all(np.diff(times) >= -1e-15), batch
    by_batch = [decode(model, b, 100) for b in range(1, 17)]
    assert np.all(np.diff(by_batch) >= -1e-15)
    tokens = [model.device_time_s(StepShape((t,), (0,))) for t in range(16, 257, 8)]
    assert np.all(np.diff(tokens) > 0)
    absorbed = [model.device_time_s(StepShape((64,), (p,))) for p in range(16, 65, 4)]
    assert np.all(np.diff(absorbed) > 0)
    # between grid points it stays within its two neighbours (no overshoot)
    lo, hi = decode(model, 4, 64), decode(model, 4, 256)
    assert lo < decode(model, 4, 150) < hi
    assert model.fallbacks == {"decode": 0, "prefill": 0}


def test_a_scalar_query_gives_the_floats_of_an_array_query():
    """Curve answers one point in plain floats: it must give np.interp's floats (records stay identical),
    at grid points, between them, below the first and past the last."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 7))
        xs = np.sort(rng.choice(50_000, n, replace=False)).astype(float) * rng.random()
        curve = Curve(xs, rng.random(n) * rng.choice([1e-4, 1.0, 30.0]))
        points = [float(xs[rng.integers(n)]), float(rng.random() * xs[-1] * 1.5), -1.0, float(rng.integers(0, 60_000))]
        for x in points:
            assert curve(x) == curve(np.array([x]))[0]


def test_graph_batches_are_priced_at_their_padded_capture_size():
    model = small_model()
    assert capture_batch_sizes(16)[:6] == [1, 2, 4, 8, 12, 16]
    # batch 3 replays the batch-4 graph (one padding row attending one token)
    assert decode(model, 3, 64) == pytest.approx(model.graph.lookup(4, np.array([3 * 64 + 1.0]))[0][0])


def test_graph_limit_switches_decode_to_the_eager_table():
    graphs_to_4 = small_model(cuda_graph_max_bs=4)
    eager = table("decode").query("path == 'eager' and batch_size == 16 and context_tokens == 64")["device_s"].item()
    graph = table("decode").query("path == 'graph' and batch_size == 4 and context_tokens == 64")["device_s"].item()
    assert decode(graphs_to_4, 16, 64) == pytest.approx(eager)
    assert decode(graphs_to_4, 4, 64) == pytest.approx(graph)
    assert decode(small_model(cuda_graph=False), 4, 64) > graph


def test_outside_the_grid_it_falls_back_to_the_scaled_roofline_and_counts_it():
    model = small_model()
    inside = decode(model, 4, 256)
    far = decode(model, 4, 4096)                                # 16x the largest measured context
    assert model.fallbacks["decode"] == 1 and model.summary()["fallback_steps"]["decode"] == 1
    roof = model.roofline
    ratio = inside / (roof.step_time_s(StepShape(num_decode_reqs=4, decode_context_tokens=4 * 256))
                      - roof.host_time_s(StepShape(num_decode_reqs=4, decode_context_tokens=4 * 256)))
    far_roof = StepShape(num_decode_reqs=4, decode_context_tokens=4 * 4096)
    assert far == pytest.approx(ratio * (roof.step_time_s(far_roof) - roof.host_time_s(far_roof)))
    assert far > inside
    model.device_time_s(StepShape((1024,), (0,)))               # 4x the largest measured prefill
    assert model.fallbacks["prefill"] == 1
    assert model.summary()["fallback_share"] == pytest.approx(2 / model.num_priced)


def test_decode_runs_match_single_steps_and_host_time_is_added():
    model = small_model()
    contexts = np.array([64, 200, 1000, 60000])                  # the last one falls back
    run = model.decode_times_s(4, contexts)
    single = [model.step_time_s(StepShape(num_decode_reqs=4, decode_context_tokens=int(c))) for c in contexts]
    np.testing.assert_allclose(run, single, rtol=1e-12)
    host = model.host_time_s(StepShape(num_decode_reqs=4, decode_context_tokens=4))
    assert host == pytest.approx(8e-5)                          # schedule + commit of the host table
    assert model.breakdown_s(StepShape((64,), (0,)))["host"] > 0


@pytest.mark.parametrize("graph_limit", [None, 4])
def test_a_run_of_batches_is_priced_in_one_call_as_batch_by_batch(graph_limit, tmp_path):
    """decode_segment_times_s (one pass over a run's shrinking batches) gives the very floats of one
    decode_times_s call per batch: graph and eager batches, padded ones, shared prefixes, steps past
    the grid (fallbacks, counted the same)."""
    import shutil
    from sim.costmodel.base import decode_segments_one_by_one
    shutil.copytree(SMALL, tmp_path / "profile")
    shared_rows(small_model(), 0.35).to_csv(tmp_path / "profile" / "decode_shared.csv", index=False)
    core = build_core(compose_config(TINY))

    def make():
        return ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                                 profile=str(tmp_path / "profile"), cuda_graph_max_bs=graph_limit)
    num_reqs, steps, shared = [16, 15, 9, 6, 3, 3, 1], [3, 1, 4, 2, 5, 1, 2], [15 * 40, 0, 8 * 40, 0, 2 * 40, 0, 0]
    contexts, firsts = [], []
    for n, k in zip(num_reqs, steps):
        first = n * 200 if n != 3 else n * 2000                  # the batches of 3 attend past the grid
        contexts.append(first + n * np.arange(k))
        firsts.append(np.full(n, first // n))
    context = np.concatenate(contexts)
    one, every = make(), make()
    at_once = one.decode_segment_times_s(num_reqs, steps, context, shared, firsts)
    by_batch = decode_segments_one_by_one(every, num_reqs, steps, context, shared, firsts)
    assert at_once.tolist() == by_batch.tolist()                 # bit for bit
    assert one.fallbacks == every.fallbacks and one.fallbacks["decode"] > 0
    assert one.num_priced == every.num_priced == sum(steps)


def test_auto_picks_the_profile_only_where_one_applies():
    cfg = compose_config(["costmodel=auto"])
    core = build_core(cfg)
    chosen = instantiate(cfg.costmodel)(model=core.model, hardware=core.hardware, layout=core.layout)
    assert isinstance(chosen, ProfiledCostModel)                 # committed: sim/profiles/h200/deepseek_v2_lite
    tiny = compose_config(["costmodel=auto"] + TINY)
    core = build_core(tiny)
    assert isinstance(instantiate(tiny.costmodel)(model=core.model, hardware=core.hardware, layout=core.layout),
                      RooflineCostModel)
    core = build_core(compose_config(["tp=2"]))                    # committed: .../deepseek_v2_lite/tp2
    tp2 = instantiate(cfg.costmodel)(model=core.model, hardware=core.hardware, layout=ParallelLayout(tp=2))
    assert isinstance(tp2, ProfiledCostModel) and tp2.directory.name == "tp2"
    core = build_core(compose_config(["tp=4"]))                    # no tp=4 profile: the roofline
    assert isinstance(instantiate(cfg.costmodel)(model=core.model, hardware=core.hardware,
                                                 layout=ParallelLayout(tp=4)), RooflineCostModel)


def test_capture_grid_matches_the_runtime():
    torch_runner = pytest.importorskip("runtime.engine.cuda_graph_runner")
    for max_bs in (1, 7, 160, 1024):
        assert capture_batch_sizes(max_bs) == torch_runner.capture_batch_sizes(max_bs)


def shared_rows(model: ProfiledCostModel, fraction: float) -> pd.DataFrame:
    """decode_shared rows whose times follow `fraction` exactly on the small profile's graph table."""
    rows = []
    for batch, group, shared, private in [(4, 2, 128, 16), (4, 4, 192, 32), (16, 4, 128, 64), (16, 16, 200, 40),
                                          (16, 1, 128, 64)]:
        total, unique = batch * (shared + private), batch // group * shared + batch * private
        p1, p0 = model.graph.lookup(batch, np.array([total, unique], dtype=float))[0]
        rows.append({"order": "grouped", "batch_size": batch, "group_size": group, "shared_tokens": shared,
                     "private_tokens": private, "path": "graph", "total_context_tokens": total,
                     "unique_tokens": unique, "device_s": p0 + (fraction if group > 1 else 1.0) * (p1 - p0)})
    return pd.DataFrame(rows)


def test_shared_prefix_reads_are_priced_at_the_fraction_the_profile_shows(tmp_path):
    import shutil
    shutil.copytree(SMALL, tmp_path / "profile")
    assert small_model().shared_read_fraction == 1.0             # no decode_shared table: every read private
    shared_rows(small_model(), 0.35).to_csv(tmp_path / "profile" / "decode_shared.csv", index=False)
    core = build_core(compose_config(TINY))
    model = ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                              profile=str(tmp_path / "profile"))
    assert model.shared_read_fraction == pytest.approx(0.35, abs=1e-9)
    assert model.shared_fit.num_rows == 4 and model.shared_fit.median_abs_error < 1e-9
    assert model.summary()["shared_read_fraction"] == pytest.approx(0.35)
    private = StepShape(num_decode_reqs=16, decode_context_tokens=16 * 200)
    shared = StepShape(num_decode_reqs=16, decode_context_tokens=16 * 200, decode_shared_tokens=15 * 160)
    as_private = StepShape(num_decode_reqs=16, decode_context_tokens=int(16 * 200 - 0.65 * 15 * 160))
    assert model.device_time_s(shared) == pytest.approx(model.device_time_s(as_private), rel=1e-9)
    assert model.device_time_s(shared) < model.device_time_s(private)
    contexts = np.array([16 * 200, 16 * 201, 16 * 202])
    run = model.decode_times_s(16, contexts, 15 * 160)             # a decode run prices what single steps do
    single = [model.step_time_s(StepShape(num_decode_reqs=16, decode_context_tokens=int(c),
                                          decode_shared_tokens=15 * 160)) for c in contexts]
    np.testing.assert_allclose(run, single, rtol=1e-12)


def test_shared_read_fraction_is_clipped_to_what_reads_can_cost():
    from sim.costmodel.shared_reads import fit_shared_read_fraction
    model = small_model()
    tables = {"graph": model.graph, "eager": model.eager}
    assert fit_shared_read_fraction(shared_rows(model, 1.6), tables).fraction == 1.0
    assert fit_shared_read_fraction(shared_rows(model, -0.5), tables).fraction == 0.0
    assert fit_shared_read_fraction(shared_rows(model, 0.5).iloc[-1:], tables) is None   # controls only


def test_prefix_expansion_rate_is_fitted_on_the_multi_sequence_mha_points(tmp_path):
    """Several sequences with cached prefixes in MHA form expand every sequence's prefix: the per-token rate
    comes from those points (measured - the single-sequence price at the same attention pairs), not from
    one sequence's slope along the prefix, and a step of more sequences than any measured is priced by it."""
    import shutil
    shutil.copytree(SMALL, tmp_path / "profile")
    base = small_model()
    single_slope = base.expand_s_per_token          # no multi-sequence MHA point with a prefix: the slope
    assert single_slope > 0
    rate = single_slope / 2
    rows = []
    for seqs, new, prefix in [(4, 64, 4096), (4, 256, 8192), (8, 64, 2048), (8, 256, 4096)]:
        each = new // seqs
        assert base._form([prefix] * seqs, [prefix + each] * seqs) == "mha"
        p_eq = seqs * (each * (each + 1) / 2 + each * prefix) / new - (new + 1) / 2
        single, _ = base.single.lookup(new, p_eq, base.columns["mha"])
        rows.append({"num_seqs": seqs, "new_tokens": new, "prefix_tokens": prefix, "repeats": 3,
                     "device_s": single + rate * (seqs * prefix - p_eq), "device_min_s": 0.0, "launch_host_s": 0.0})
    prefill = pd.concat([table("prefill"), pd.DataFrame(rows)], ignore_index=True)
    prefill.to_csv(tmp_path / "profile" / "prefill.csv", index=False)
    core = build_core(compose_config(TINY))
    model = ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                              profile=str(tmp_path / "profile"))
    assert model.expand_s_per_token == pytest.approx(rate, rel=1e-9)
    many = StepShape(extend_new_tokens=(8,) * 16, extend_prefix_tokens=(2048,) * 16)   # 16 sequences: none measured
    p_eq = 16 * (8 * 9 / 2 + 8 * 2048) / 128 - 129 / 2
    single, _ = model.single.lookup(128, p_eq, model.columns["mha"])
    factor = model._multi_factor("mha", 16, 128, 2048)
    assert factor == pytest.approx(1.0, abs=1e-9)   # the fitted rate explains the points: no correction left
    assert model.device_time_s(many) == pytest.approx(single + rate * (16 * 2048 - p_eq), rel=1e-9)


def test_the_launch_bound_part_is_the_interval_back_to_back_minus_the_device_time_alone(tmp_path):
    """A profile with `device_alone_s` (each step timed again with its launch hidden behind a sleep kernel)
    gives steps with extends a launch-bound part: back-to-back interval minus device time alone, at the
    step's tokens and equivalent prefix, at most what the launch (host table) outlasts the device time
    alone; decode-only steps none; a profile without the column none."""
    import shutil
    shutil.copytree(SMALL, tmp_path / "profile")
    prefill = table("prefill")
    prefill["device_alone_s"] = np.where(prefill["new_tokens"] <= 64, 0.4, 1.0) * prefill["device_s"]
    prefill.to_csv(tmp_path / "profile" / "prefill.csv", index=False)
    core = build_core(compose_config(TINY))

    def model_with_launch(launch_s: float) -> ProfiledCostModel:
        host = pd.read_csv(SMALL / "host.csv")
        host.loc[host["kind"] != "decode", "launch_s"] = launch_s
        host.to_csv(tmp_path / "profile" / "host.csv", index=False)
        return ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                                 profile=str(tmp_path / "profile"))
    row = prefill[(prefill["num_seqs"] == 1) & (prefill["prefix_tokens"] == 0)].sort_values("new_tokens").iloc[0]
    shape = StepShape(extend_new_tokens=(int(row["new_tokens"]),), extend_prefix_tokens=(0,))
    assert int(row["new_tokens"]) <= 64
    alone_s = 0.4 * row["device_s"]
    assert model_with_launch(10 * row["device_s"]).launch_bound_s(shape) == pytest.approx(0.6 * row["device_s"], rel=1e-9)
    partly = alone_s + 0.25 * row["device_s"]         # the launch outlasts the kernels by a quarter of the step
    assert model_with_launch(partly).launch_bound_s(shape) == pytest.approx(0.25 * row["device_s"], rel=1e-6)
    assert model_with_launch(0.5 * alone_s).launch_bound_s(shape) == 0.0     # device-bound: nothing to hide
    # ... whose back-to-back excess a step right behind a decode does not pay (graph replays only)
    assert model_with_launch(0.5 * alone_s).after_decode_saving_s(shape) == pytest.approx(0.6 * row["device_s"], rel=1e-9)
    assert model_with_launch(partly).after_decode_saving_s(shape) == 0.0      # launch-bound: the head start rule
    model = model_with_launch(10 * row["device_s"])
    big = prefill[(prefill["num_seqs"] == 1) & (prefill["prefix_tokens"] == 0)]["new_tokens"].max()
    assert model.launch_bound_s(StepShape(extend_new_tokens=(int(big),), extend_prefix_tokens=(0,))) == 0.0
    assert model.launch_bound_s(StepShape(num_decode_reqs=4, decode_context_tokens=400)) == 0.0
    assert model.num_priced == 0                     # asking for the bound prices nothing twice
    assert small_model().launch_bound_s(shape) == 0.0   # no device_alone_s column
    assert small_model().after_decode_saving_s(shape) == 0.0
    assert model.after_decode_saving_s(StepShape(num_decode_reqs=4, decode_context_tokens=400)) == 0.0


def test_only_decodes_within_the_graph_limit_wait_for_their_launch():
    """device_waits_for_launch follows the decode tables' choice: graph up to cuda_graph_max_bs, eager past it."""
    from sim.costmodel.replay import ReplayCostModel
    graphs_to_4 = small_model(cuda_graph_max_bs=4)
    decode = lambda n: StepShape(num_decode_reqs=n, decode_context_tokens=64 * n)      # noqa: E731
    assert graphs_to_4.device_waits_for_launch(decode(4)) and not graphs_to_4.device_waits_for_launch(decode(5))
    assert not graphs_to_4.device_waits_for_launch(StepShape(extend_new_tokens=(16,), extend_prefix_tokens=(0,)))
    assert not ReplayCostModel([0.1]).device_waits_for_launch(decode(1))     # recorded durations hold the wait


def _profile_with_piecewise_limit(tmp_path: Path, limit: int) -> Path:
    """profile_small with a meta.json that says its prefill table was measured with piecewise graphs up to
    `limit` tokens, and its 256-token points made eager-like (launch-bound: 3x the graph-replayed time)."""
    directory = tmp_path / "profile"
    directory.mkdir()
    for name in ("decode", "host"):
        table(name).to_csv(directory / f"{name}.csv", index=False)
    prefill = table("prefill")
    eager = prefill["new_tokens"] > limit
    prefill.loc[eager, "device_s"] *= 3.0
    prefill.to_csv(directory / "prefill.csv", index=False)
    (directory / "meta.json").write_text(
        '{"runs": [{"sections": ["decode"], "piecewise_max_tokens": 8},'
        f' {{"sections": ["prefill", "mixed"], "piecewise_max_tokens": {limit}}}]}}')
    return directory


def profiled_at(directory: Path, **kw) -> ProfiledCostModel:
    core = build_core(compose_config(TINY))
    return ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                             profile=str(directory), **kw)


def test_prefill_never_interpolates_across_the_piecewise_graph_limit(tmp_path):
    """Steps past the piecewise graphs' limit launch every kernel eagerly (the runtime's two regimes): a step
    past the limit is priced on the line from the graph-replayed step at the limit to the first eager point
    (the same device work as at the limit, launched eagerly), never below its eager launch; below the limit
    from the graph-replayed points only. Without a point at the limit, the eager curve is flat below its
    first point."""
    directory = _profile_with_piecewise_limit(tmp_path, limit=64)
    model = profiled_at(directory, piecewise_max_tokens=64)
    prefill = table("prefill").query("num_seqs == 1 and prefix_tokens == 0").set_index("new_tokens")["device_s"]
    eager_first = 3.0 * prefill[256]
    line = lambda n: prefill[64] + (eager_first - prefill[64]) * (n - 64) / (256 - 64)   # noqa: E731
    assert model.device_time_s(StepShape((65,), (0,))) == pytest.approx(line(65), rel=1e-9)
    assert model.device_time_s(StepShape((200,), (0,))) == pytest.approx(line(200), rel=1e-9)
    assert model.device_time_s(StepShape((256,), (0,))) == pytest.approx(eager_first, rel=1e-9)
    assert model.device_time_s(StepShape((64,), (0,))) == pytest.approx(prefill[64], rel=1e-9)
    below = model.device_time_s(StepShape((40,), (0,)))          # graph points only: between 16 and 64
    assert prefill[16] < below < prefill[64]
    assert model.fallbacks["prefill"] == 0
    # an eager step whose launch (host.csv's launch_s past the limit) outlasts its device work takes the launch
    host = pd.read_csv(directory / "host.csv")
    host.loc[(host["kind"] == "prefill") & (host["new_tokens"] == 256), "launch_s"] = 0.02
    host.to_csv(directory / "host.csv", index=False)
    launch_bound = profiled_at(directory, piecewise_max_tokens=64)
    assert launch_bound.device_time_s(StepShape((65,), (0,))) == pytest.approx(0.02, rel=1e-9)
    assert launch_bound.device_time_s(StepShape((64,), (0,))) == pytest.approx(prefill[64], rel=1e-9)
    # limit 100: the profile has no graph-replayed point there, so below 256 the eager curve stays flat
    (directory / "meta.json").write_text('{"runs": [{"sections": ["prefill"], "piecewise_max_tokens": 100}]}')
    table("host").to_csv(directory / "host.csv", index=False)
    flat = profiled_at(directory, piecewise_max_tokens=100)
    assert flat.device_time_s(StepShape((101,), (0,))) == pytest.approx(eager_first, rel=1e-9)
    # a profile without the limit recorded, or measured without piecewise graphs (limit 0: a CPU profile),
    # keeps one curve through every point (interpolated across), inside the grid
    for meta in (None, '{"runs": [{"sections": ["prefill"], "piecewise_max_tokens": 0}]}'):
        (directory / "meta.json").unlink(missing_ok=True)
        if meta is not None:
            (directory / "meta.json").write_text(meta)
        one_regime = profiled_at(directory, piecewise_max_tokens=64)
        assert prefill[64] < one_regime.device_time_s(StepShape((65,), (0,))) < eager_first
        assert one_regime.device_time_s(StepShape((16,) * 4, (0,) * 4)) > 0
        assert one_regime.fallbacks["prefill"] == 0


def test_the_eager_curve_starts_at_the_limits_device_time_plus_the_eager_launch_share(tmp_path):
    """With device_alone_s measured, the eager curve starts at the graph-replayed step's device time alone at
    the limit plus the first eager point's launch-bound share (back to back minus alone): a launch cost that
    does not shrink with the tokens (tp=2 on the H200: eager launches of ~44 ms that wait on the device), while
    graph-replayed steps up to the limit keep their back-to-back times; the launch-bound part of a step past
    the limit (what a head start can hide) is that share."""
    directory = _profile_with_piecewise_limit(tmp_path, limit=64)
    prefill = pd.read_csv(directory / "prefill.csv")
    prefill["device_alone_s"] = prefill["device_s"] * 0.8                 # graph points: 20% launch-bound
    eager = prefill["new_tokens"] > 64
    prefill.loc[eager, "device_alone_s"] = prefill.loc[eager, "device_s"] / 3.0   # eager: 2/3 launch-bound
    prefill.to_csv(directory / "prefill.csv", index=False)
    model = profiled_at(directory, piecewise_max_tokens=64)
    one = prefill.query("num_seqs == 1 and prefix_tokens == 0").set_index("new_tokens")
    share = one.loc[256, "device_s"] - one.loc[256, "device_alone_s"]
    start = one.loc[64, "device_alone_s"] + share
    line = lambda n: start + (one.loc[256, "device_s"] - start) * (n - 64) / (256 - 64)   # noqa: E731
    assert model.device_time_s(StepShape((65,), (0,))) == pytest.approx(line(65), rel=1e-9)
    assert model.device_time_s(StepShape((160,), (0,))) == pytest.approx(line(160), rel=1e-9)
    assert model.device_time_s(StepShape((64,), (0,))) == pytest.approx(one.loc[64, "device_s"], rel=1e-9)
    assert line(65) > one.loc[64, "device_s"]                   # the eager launch costs more than the graph's
    bound = lambda n: model.launch_bound_s(StepShape((n,), (0,)))            # noqa: E731
    launch = model.launch_time_s(StepShape((65,), (0,)))
    assert bound(65) == pytest.approx(min(share, max(launch - (line(65) - share), 0.0)), rel=1e-9)


def test_a_regime_the_profile_did_not_measure_at_that_size_falls_back(tmp_path):
    """The runtime's limit below the profile's: a 64-token step runs eagerly, which the profile only measured
    from 256 tokens on; it is priced by the roofline scaled at the eager regime's edge, and counted."""
    model = profiled_at(_profile_with_piecewise_limit(tmp_path, limit=64), piecewise_max_tokens=16)
    model.device_time_s(StepShape((64,), (0,)))
    assert model.fallbacks["prefill"] == 1
    model.device_time_s(StepShape((16,), (0,)))                  # still graph-replayed, and measured so
    assert model.fallbacks["prefill"] == 1


def test_tensor_parallel_piecewise_extends_end_with_their_lockstep_launch():
    """At tp=2 a piecewise extend's whole back-to-back excess over its kernels alone is its launch-bound part
    (launch_ends_step: the ranks launch in lockstep), and its launch is the prefill table's back-to-back one,
    not the host table's (idle device); eager extends and decodes keep the capped rule, and at tp=1 nothing
    changes."""
    profiles = Path(__file__).parents[2] / "sim" / "profiles" / "h200" / "deepseek_v2_lite"
    tp2 = profiles / "tp2"
    core = build_core(compose_config(["model=deepseek_v2_lite", "hardware=h200", "tp=2"]))
    model = ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                              profile=str(tp2), piecewise_max_tokens=2048)
    prefill = pd.read_csv(tp2 / "prefill.csv").set_index(["num_seqs", "new_tokens", "prefix_tokens"])
    shape = StepShape(extend_new_tokens=(1024,), extend_prefix_tokens=(0,))
    assert model.launch_ends_step(shape)
    single = prefill.loc[1].xs(0, level="prefix_tokens")                    # one sequence, no prefix, by tokens
    bound = [t for t in single.index if t <= 2048 and single.loc[t, "device_s"] > single.loc[t, "device_alone_s"]]
    assert bound                                                             # points whose launch outlasts their kernels
    excess = single.loc[bound[0], "device_s"] - single.loc[bound[0], "device_alone_s"]
    assert model.launch_bound_s(StepShape((int(bound[0]),), (0,))) == pytest.approx(excess, rel=1e-9)
    sizes = [t for t in single.index if t <= 2048]
    longer = [t for t in sizes if single.loc[t, "launch_host_s"] > model.launch.launch_s(1, t, 0)]
    assert longer                             # the back-to-back launch, also where it is longer than the idle one
    for tokens in sizes:
        assert model.launch_time_s(StepShape((int(tokens),), (0,))) == pytest.approx(
            single.loc[tokens, "launch_host_s"], rel=1e-9)
    eager = StepShape(extend_new_tokens=(3072,), extend_prefix_tokens=(0,))
    assert not model.launch_ends_step(eager)
    assert not model.launch_ends_step(StepShape(num_decode_reqs=8, decode_context_tokens=800))
    one = build_core(compose_config(["model=deepseek_v2_lite", "hardware=h200"]))
    tp1 = ProfiledCostModel(one.model, one.hardware, one.layout, fallback=RooflineCostModel,
                            profile=str(profiles), piecewise_max_tokens=2048)
    assert not tp1.launch_ends_step(shape)
    assert tp1.launch_time_s(shape) == pytest.approx(tp1.launch.launch_s(1, 1024, 0), rel=1e-12)


@pytest.mark.parametrize("layout,subdir", [([], ""), (["tp=2"], "tp2")])
def test_the_committed_h200_profiles_were_measured_at_the_runtimes_piecewise_limit(layout, subdir):
    """The prefill tables of the committed profiles hold each step in the launch regime the runtime runs it in
    by default (piecewise graphs up to the limit, eager past it): a change of the default limit without
    profiling anew would price every step between the two limits from the other regime."""
    from runtime.build import piecewise_graph_tokens
    from sim.costmodel.profile_tables import prefill_piecewise_limit

    directory = Path(__file__).parents[2] / "sim" / "profiles" / "h200" / "deepseek_v2_lite" / subdir
    cfg = compose_config(["mode=real", "model=deepseek_v2_lite", "hardware=h200"] + layout)
    assert prefill_piecewise_limit(directory) == piecewise_graph_tokens(cfg) == 8192


def _experts_profile(tmp_path: Path, c0: float, per_expert_s: float, per_row_s: float, per_kv_s: float) -> Path:
    """The small profile with a graph decode table whose time follows the experts its rows activate
    (tiny_mla_moe: 8 experts, 2 a token, routed uniformly) plus a cost per row and per KV token."""
    import shutil
    shutil.copytree(SMALL, tmp_path / "profile")
    rows = []
    for batch in capture_batch_sizes(256):
        active = 8 * (1 - (1 - 2 / 8) ** batch)
        for context in (16, 64, 256):
            t = c0 + per_expert_s * active + per_row_s * batch + per_kv_s * batch * context
            rows.append(("graph", batch, context, batch * context, t, t, 2e-4, 3))
    frame = pd.DataFrame(rows, columns=table("decode").columns)
    pd.concat([frame, table("decode").query("path == 'eager'")]).to_csv(tmp_path / "profile" / "decode.csv", index=False)
    return tmp_path / "profile"


def test_padding_rows_cost_one_more_rows_experts_not_their_own(tmp_path):
    """A padded graph replay's padding rows carry one token (the runtime zero-fills them): together they activate
    one token's experts, so a step of n real rows padded to P costs the table's P distinct rows less the experts
    P rows activate beyond n + 1 rows'; their per-row cost stays. Dense models and padding_rows=as_real: the
    table's row."""
    directory = _experts_profile(tmp_path, c0=1e-3, per_expert_s=2e-4, per_row_s=1e-5, per_kv_s=1e-8)
    core = build_core(compose_config(TINY))
    alike, as_real = (ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                                        profile=str(directory), padding_rows=mode) for mode in ("alike", "as_real"))
    active = lambda b: 8 * (1 - 0.75 ** b)                                  # noqa: E731
    assert capture_batch_sizes(32)[4] == 12
    for n in (9, 10):                                                       # padded to 12
        saving = 2e-4 * (active(12) - active(n + 1))
        assert decode(alike, n, 64) == pytest.approx(decode(as_real, n, 64) - saving, rel=1e-4)
    assert decode(alike, 9, 64) < decode(alike, 10, 64) < decode(alike, 11, 64) == decode(as_real, 11, 64)
    assert decode(alike, 12, 64) == decode(as_real, 12, 64)                 # no padding
    # every expert active on both sides of the padded batch (200 -> 208): padding rows cost what real rows do
    assert decode(alike, 200, 64) == pytest.approx(decode(as_real, 200, 64), rel=1e-6)
    dense = build_core(compose_config(["model=tiny_llama", "hardware=cpu"]))
    dense_model = ProfiledCostModel(dense.model, dense.hardware, dense.layout, fallback=RooflineCostModel,
                                    profile=str(directory))
    assert dense_model.padding_saving_s(12, 9) == 0.0
    with pytest.raises(ValueError, match="padding_rows='distinct': expected one of alike, as_real"):
        ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel, profile=str(directory),
                          padding_rows="distinct")
