"""Simulator speed: the full Mooncake conversation trace (12,031 requests, ~59 min of traffic)
with deepseek_v2_lite on h200, policy lpm. Prints simulated seconds per wall second.

  python experiments/bench_sim_speed.py [overrides...]           # prints the row only
  python experiments/bench_sim_speed.py --write [overrides...]   # also appends it to RESULTS_CSV
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import time
from pathlib import Path

from hydra.utils import instantiate

from experiments.compose import compose_config
from runtime.build import build_core
from sim.driver import SimDriver
from sim.executor import SimExecutor

RESULTS_CSV = "experiments/results/cpu/sim_speed.csv"   # committed results
DEFAULTS = ["workload=mooncake_conversation", "model=deepseek_v2_lite", "hardware=h200", "policy=lpm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"append the row to {RESULTS_CSV}")
    parser.add_argument("--out", default=None, help="append the row to this CSV instead")
    parser.add_argument("--no-fast-forward", action="store_true", help="step every decode one by one")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    cfg = compose_config(DEFAULTS + [f"sim.fast_forward={not args.no_fast_forward}"] + args.overrides)

    t0 = time.perf_counter()
    specs = instantiate(cfg.workload).requests()
    t1 = time.perf_counter()
    core = build_core(cfg)
    cost_model = instantiate(cfg.costmodel)(model=core.model, hardware=core.hardware, layout=core.layout)
    driver = SimDriver(core.scheduler, SimExecutor(cost_model, core.model.vocab_size),
                       fast_forward=bool(cfg.sim.fast_forward), max_run_steps=int(cfg.sim.max_run_steps))
    outcome = driver.run(specs)
    t2 = time.perf_counter()

    sim_wall_s, load_wall_s = t2 - t1, t1 - t0
    row = {
        "requests": len(outcome.requests),
        "finished": sum(r.finish_reason is not None and r.finish_reason.value in ("length", "stop") for r in outcome.requests),
        "steps": len(outcome.steps),
        "simulated_s": round(outcome.sim_time_s, 3),
        "trace_load_wall_s": round(load_wall_s, 3),
        "sim_wall_s": round(sim_wall_s, 3),
        "speedup_sim_loop": round(outcome.sim_time_s / sim_wall_s, 1),
        "speedup_incl_load": round(outcome.sim_time_s / (sim_wall_s + load_wall_s), 1),
        "requests_per_wall_s": round(len(outcome.requests) / sim_wall_s, 1),
        "fast_forward": bool(cfg.sim.fast_forward),
        "overrides": " ".join(args.overrides),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    for key, value in row.items():
        print(f"{key:>22}: {value}")
    if not (args.write or args.out):
        return
    out = Path(args.out or RESULTS_CSV)
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with out.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


if __name__ == "__main__":
    main()
