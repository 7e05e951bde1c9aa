"""The simulator's price of the decode steps experiments/bench_parallel.py speed measured: every row of its
CSV (model and overrides, layout, batch, context, path) priced by the `mode=sim` cost model of that layout,
written beside it as <csv>_predicted.csv and printed as a table. Torch-free: runs on CPU after a GPU run.

  python -m experiments.parallel_predict OUT/parallel_decode_deepseek_v2_lite.csv --hardware h200
  python -m experiments.parallel_predict CSV --hardware h100 --costmodel roofline   # another cost model
  python -m experiments.parallel_predict CSV --collectives OUT/collectives.csv   # a run's own table first

Which price goes with which measurement: forward_graphs / forward_eager (the runner's forward, a graph
replay or eager launches, plus the greedy argmax) against the step's device time (step_time_s - host_time_s,
what mode=sim charges a step under overlap scheduling), with every decode a graph replay or none;
served_step (prepare, broadcast, run, tokens to the host, no overlap) against the whole step (step_time_s);
served_pipelined (served steps launched as the overlap loop launches them: each step's device interval) against
the device time, as forward.
Context C per sequence means C tokens of KV read by each of the batch's decodes (bench_real_decode.decode_plan).
Collectives come from the measured tables the cost model finds (sim/costmodel/collective_table.py), after
`--collectives` when given.
"""
from __future__ import annotations

import argparse
import csv
import functools
from pathlib import Path

from experiments.rows_csv import write_rows_csv

DEVICE_PATHS = ("forward_graphs", "forward_eager", "served_pipelined")


@functools.lru_cache(maxsize=None)
def cost_model(model: str, overrides: str, hardware: str, costmodel: str, tp: int, ep: int, graphs: bool,
               collectives: str | None = None):
    """The cost model mode=sim builds for this layout, with decode graphs at every batch (graphs) or none;
    `collectives`: a table read ahead of the hardware's."""
    from hydra.utils import instantiate
    from omegaconf import open_dict

    from experiments.compose import compose_config
    from runtime.build import build_layout

    cfg = compose_config(["mode=sim", f"model={model}", *overrides.split(), f"hardware={hardware}",
                          f"tp={tp}", f"ep={ep}", f"costmodel={costmodel}"])
    if collectives:
        with open_dict(cfg):
            for node in (cfg.costmodel, *(v for v in cfg.costmodel.values() if hasattr(v, "keys"))):
                if node.get("collective_table") == "auto":
                    node.collective_table = [collectives, "auto"]
    spec, gpu, layout = instantiate(cfg.model), instantiate(cfg.hardware), build_layout(cfg)
    layout.validate(spec)
    return instantiate(cfg.costmodel)(model=spec, hardware=gpu, layout=layout,
                                      cuda_graph_max_bs=None if graphs else 0, piecewise_max_tokens=0)


def predict_row(row: dict, hardware: str, costmodel: str, collectives: str | None = None) -> dict:
    from sim.costmodel.base import StepShape

    batch, context = int(row["batch"]), int(row["context"])
    cost = cost_model(row["model"], row.get("model_overrides", "") or "", hardware, costmodel,
                      int(row["tp"]), int(row["ep"]), row["path"] != "forward_eager", collectives)
    shape = StepShape(num_decode_reqs=batch, decode_context_tokens=batch * context)
    step_ms = 1e3 * cost.step_time_s(shape)
    device_ms = step_ms - 1e3 * cost.host_time_s(shape)
    predicted = device_ms if row["path"] in DEVICE_PATHS else step_ms
    return dict(row, hardware=hardware, costmodel=type(cost).__name__, pred_device_ms=round(device_ms, 4),
                pred_step_ms=round(step_ms, 4), predicted_ms=round(predicted, 4),
                measured_over_predicted=round(float(row["ms_median"]) / predicted, 3))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", type=Path, nargs="+", help="parallel_decode_<model>.csv of bench_parallel speed")
    p.add_argument("--hardware", default="h200", help="conf/hardware option of the GPUs that measured it")
    p.add_argument("--costmodel", default="auto", help="conf/costmodel option (auto: as mode=sim picks)")
    p.add_argument("--collectives", help="a collectives.csv (bench_collectives) read ahead of the hardware's")
    args = p.parse_args(argv)
    for path in args.csv:
        with path.open(newline="") as f:
            rows = [predict_row(r, args.hardware, args.costmodel, args.collectives) for r in csv.DictReader(f)]
        out = write_rows_csv(path.with_name(path.stem + "_predicted.csv"), rows)
        print(f"{path.name} on {args.hardware}, costmodel={args.costmodel} -> {out}")
        print(f"{'layout':8s} {'batch':>5s} {'ctx':>5s} {'path':15s} {'measured':>9s} {'predicted':>9s} "
              f"{'meas/pred':>9s}  cost model")
        for r in rows:
            print(f"{r['layout']:8s} {r['batch']:>5s} {r['context']:>5s} {r['path']:15s} {float(r['ms_median']):9.3f} "
                  f"{r['predicted_ms']:9.3f} {r['measured_over_predicted']:9.3f}  {r['costmodel']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
