"""Collective cost: alpha-beta arithmetic (graph vs eager apart, node boundary), measured tables
with interpolation and fallback, and the table search path."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.core.hardware import HardwareSpec
from sim.costmodel.collective_table import (
    MeasuredCollectives, build_collectives, find_collective_table, find_collective_tables,
)
from sim.costmodel.collectives import AlphaBetaCollectives, bus_factor

AB = AlphaBetaCollectives(intra_node_bandwidth_bytes_per_s=300e9, inter_node_bandwidth_bytes_per_s=40e9,
                          gpus_per_node=8, graph_latency_s=5e-6, eager_latency_s=15e-6,
                          per_rank_latency_s=1e-6, inter_node_latency_s=20e-6)


def test_alpha_beta_arithmetic() -> None:
    mb = 1e6
    assert AB.time_s("all_reduce", mb, 1, graph=False) == 0.0
    assert AB.time_s("all_reduce", mb, 2, graph=True) == pytest.approx(5e-6 + 1e-6 + 1.0 * mb / 300e9)
    assert AB.time_s("all_reduce", mb, 8, graph=False) == pytest.approx(15e-6 + 7e-6 + 1.75 * mb / 300e9)
    assert AB.time_s("all_gather", mb, 4, graph=True) == pytest.approx(5e-6 + 3e-6 + 0.75 * mb / 300e9)
    # 16 ranks leave the node: NIC bandwidth and the inter-node latency
    assert AB.time_s("all_to_all", mb, 16, graph=True) == pytest.approx(5e-6 + 15e-6 + 20e-6 + 15 / 16 * mb / 40e9)


def test_graph_is_cheaper_than_eager_and_time_grows_with_size_and_ranks() -> None:
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        sizes = [1e3, 1e5, 1e7]
        for n in (2, 8, 16, 64):
            times = [AB.time_s(op, s, n, graph=True) for s in sizes]
            assert times == sorted(times) and times[0] < times[-1]
            assert AB.time_s(op, 1e5, n, graph=True) < AB.time_s(op, 1e5, n, graph=False)
        assert AB.time_s(op, 1e6, 2, True) < AB.time_s(op, 1e6, 8, True) < AB.time_s(op, 1e6, 16, True)
    assert bus_factor("all_reduce", 8) == 2 * bus_factor("all_gather", 8)
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        AB.time_s("broadcast", 1.0, 2, graph=True)


def test_measured_table_interpolates_and_falls_back() -> None:
    rows = [("all_reduce", 2, 1e3, True, 4e-6), ("all_reduce", 2, 1e6, True, 10e-6),
            ("all_reduce", 2, 2e6, True, 14e-6), ("all_reduce", 2, 1e3, False, 20e-6)]
    table = MeasuredCollectives(rows, fallback=AB)
    assert table.time_s("all_reduce", 10, 2, graph=True) == 4e-6                       # latency floor
    assert table.time_s("all_reduce", 1.5e6, 2, graph=True) == pytest.approx(12e-6)    # between points
    assert table.time_s("all_reduce", 4e6, 2, graph=True) == pytest.approx(22e-6)      # last slope on
    eager = table.time_s("all_reduce", 1e6, 2, graph=False)                             # one eager point:
    assert eager == pytest.approx(20e-6 + AB.time_s("all_reduce", 1e6, 2, False)       # it + AB growth
                                  - AB.time_s("all_reduce", 1e3, 2, False))
    assert table.time_s("all_gather", 1e6, 2, graph=True) == AB.time_s("all_gather", 1e6, 2, True)
    assert table.time_s("all_reduce", 1e6, 8, graph=True) == AB.time_s("all_reduce", 1e6, 8, True)
    assert table.covers("all_reduce", 2, True) and not table.covers("all_reduce", 4, True)


def test_csv_tables_are_found_and_read(tmp_path: Path) -> None:
    assert find_collective_table("nohw", root=tmp_path) is None
    results = tmp_path / "experiments" / "results" / "nohw"
    results.mkdir(parents=True)
    (results / "collectives.csv").write_text(
        "collective,num_ranks,size_bytes,graph,time_s\nall_gather,2,1024,1,3e-06\nall_gather,2,1048576,1,9e-06\n")
    assert find_collective_table("nohw", root=tmp_path) == results / "collectives.csv"
    profiles = tmp_path / "sim" / "profiles" / "nohw"
    profiles.mkdir(parents=True)
    (profiles / "collectives.csv").write_text("collective,num_ranks,size_bytes,graph,time_s\n")
    assert find_collective_table("nohw", root=tmp_path) == profiles / "collectives.csv"   # profiles first
    table = MeasuredCollectives.from_csv(results / "collectives.csv", fallback=AB)
    assert table.time_s("all_gather", 1024, 2, graph=True) == 3e-6
    (results / "bad.csv").write_text("op,ranks\n")
    with pytest.raises(ValueError, match="missing columns"):
        MeasuredCollectives.from_csv(results / "bad.csv", fallback=AB)


def test_build_collectives_uses_hardware_and_table(tmp_path: Path) -> None:
    hw = HardwareSpec("nohw", 80e9, 3e12, 1e15, 2e15, 450e9, num_gpus_per_node=8)
    kwargs = dict(comm_efficiency=0.5, inter_node_bandwidth_bytes_per_s=45e9, graph_latency_s=5e-6,
                  eager_latency_s=15e-6, per_rank_latency_s=0.5e-6, inter_node_latency_s=15e-6)
    model = build_collectives(hw, table=None, **kwargs)
    assert isinstance(model, AlphaBetaCollectives) and model.intra_node_bandwidth_bytes_per_s == 225e9
    csv = tmp_path / "c.csv"
    csv.write_text("collective,num_ranks,size_bytes,graph,time_s\nall_reduce,2,8,0,7e-06\n")
    measured = build_collectives(hw, table=str(csv), **kwargs)
    assert measured.time_s("all_reduce", 8, 2, graph=False) == 7e-6


def test_tables_of_larger_hosts_add_their_group_sizes(tmp_path: Path) -> None:
    """experiments/results/<hw>x<N>/collectives.csv (a run on N GPUs) adds its group sizes to the
    hardware's table; a curve the first table already has stays the first table's."""
    header = "collective,num_ranks,size_bytes,graph,time_s\n"
    results = tmp_path / "experiments" / "results"
    for name, body in (("nohw", "all_reduce,2,1024,1,1e-05\nall_reduce,2,1048576,1,2e-05\n"),
                       ("nohwx4", "all_reduce,4,1024,1,3e-05\nall_reduce,4,1048576,1,5e-05\n"
                                  "all_reduce,2,1024,1,9e-05\n"),
                       ("nohwx8", "all_gather,8,1024,0,7e-05\n"),
                       ("nohwx4_old", "all_reduce,4,1024,1,1.0\n"),          # not a host size: ignored
                       ("otherx4", "all_reduce,4,1024,1,1.0\n")):
        (results / name).mkdir(parents=True)
        (results / name / "collectives.csv").write_text(header + body)
    found = find_collective_tables("nohw", root=tmp_path)
    assert found == [results / d / "collectives.csv" for d in ("nohw", "nohwx4", "nohwx8")]
    hw = HardwareSpec("nohw", 80e9, 3e12, 1e15, 2e15, 450e9, num_gpus_per_node=8)
    cost = build_collectives(hw, comm_efficiency=0.5, inter_node_bandwidth_bytes_per_s=45e9, graph_latency_s=5e-6,
                             eager_latency_s=15e-6, per_rank_latency_s=0.5e-6, inter_node_latency_s=15e-6,
                             root=tmp_path)
    assert cost.time_s("all_reduce", 1024, 2, graph=True) == 1e-5              # the 2-GPU table's curve
    assert cost.time_s("all_reduce", 1024, 4, graph=True) == 3e-5              # the 4-GPU rows
    assert cost.time_s("all_reduce", 524800, 4, graph=True) == pytest.approx(4e-5)
    assert cost.time_s("all_gather", 512, 8, graph=False) == 7e-5
    assert cost.covers("all_reduce", 4, True) and not cost.covers("all_reduce", 4, False)
    # no table of the hardware itself: the host tables alone
    (results / "nohw" / "collectives.csv").unlink()
    assert find_collective_table("nohw", root=tmp_path) == results / "nohwx4" / "collectives.csv"
    alone = build_collectives(hw, comm_efficiency=0.5, inter_node_bandwidth_bytes_per_s=45e9, graph_latency_s=5e-6,
                              eager_latency_s=15e-6, per_rank_latency_s=0.5e-6, inter_node_latency_s=15e-6,
                              root=tmp_path)
    assert alone.time_s("all_reduce", 1024, 2, graph=True) == 9e-5
    # a list: a run's own table ahead of the hardware's
    run = tmp_path / "run.csv"
    run.write_text(header + "all_reduce,4,1024,1,6e-05\n")
    listed = build_collectives(hw, comm_efficiency=0.5, inter_node_bandwidth_bytes_per_s=45e9, graph_latency_s=5e-6,
                               eager_latency_s=15e-6, per_rank_latency_s=0.5e-6, inter_node_latency_s=15e-6,
                               table=[str(run), "auto"], root=tmp_path)
    assert listed.time_s("all_reduce", 1024, 4, graph=True) == 6e-5
    assert listed.time_s("all_gather", 512, 8, graph=False) == 7e-5
