"""experiments/bench_collectives.py runs on CPU (gloo, eager) and writes a table the simulator's
collective cost model reads."""
from __future__ import annotations

from experiments.bench_collectives import main
from sim.costmodel.collective_table import MeasuredCollectives
from sim.costmodel.collectives import AlphaBetaCollectives

AB = AlphaBetaCollectives(300e9, 40e9, 8, 5e-6, 15e-6, 1e-6, 20e-6)


def test_gloo_run_writes_a_readable_table(tmp_path) -> None:
    out = tmp_path / "collectives.csv"
    main(["--backend", "gloo", "--nproc", "2", "--min-log2", "10", "--max-log2", "12", "--step-log2", "2",
          "--iters", "2", "--out", str(out), "--port", "29547"])
    table = MeasuredCollectives.from_csv(out, fallback=AB)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert table.covers(op, 2, graph=False) and not table.covers(op, 2, graph=True)
        assert table.time_s(op, 1024, 2, graph=False) > 0
    assert len(out.read_text().splitlines()) == 1 + 4 * 2
