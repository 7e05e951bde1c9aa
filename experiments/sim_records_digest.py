"""A digest of a simulation's records: one SHA-256 over every step column and every request record
(tokens and token times included), to check that a change to the simulator leaves its records
identical. Runs the same setup as `bench_sim_speed.py` (the full Mooncake conversation trace,
deepseek_v2_lite on h200, policy lpm, unless overridden).

  python -m experiments.sim_records_digest [overrides...]
  python -m experiments.sim_records_digest kv.slot_allocator=paged   # the same run over real slot indices
"""
from __future__ import annotations

import argparse
import hashlib
import pickle

import pandas as pd
from hydra.utils import instantiate

from experiments.bench_sim_speed import DEFAULTS, simulate_once
from experiments.compose import compose_config
from runtime.records_io import requests_frame, steps_frame


def frame_digest(frame: pd.DataFrame) -> str:
    """SHA-256 of a frame's column names and values, column by column (lists and arrays in cells
    pickled as Python lists; floats compared bit for bit)."""
    h = hashlib.sha256()
    for name in frame.columns:
        h.update(name.encode())
        values = [v.tolist() if hasattr(v, "tolist") else v for v in frame[name].tolist()]
        h.update(pickle.dumps(values, protocol=4))
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    cfg = compose_config(DEFAULTS + args.overrides)
    specs = instantiate(cfg.workload).requests()
    outcome, wall_s, _, leaked = simulate_once(cfg, specs, pause_gc=True)
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    print(f"steps {len(steps)}  simulated {outcome.sim_time_s!r} s  loop {wall_s:.2f} s  leaked {leaked}")
    print(f"steps digest    {frame_digest(steps)}")
    print(f"requests digest {frame_digest(requests)}")


if __name__ == "__main__":
    main()
