"""The runtime's own spread: the same fidelity workloads run for real more than once (another process, machine or
day) compared with a reference set of real runs, with compare_runs' metric definitions (other / reference - 1,
step errors on steps joined by step_id, plan agreement): how far a simulator's prediction can be trusted to agree
with one real run when two real runs of the same seed disagree by this much. Torch-free.

  python -m experiments.real_spread REFERENCE_REAL_DIR OTHER_REAL_DIR [...] --out spread.csv [--only W ...]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments.compare_runs import error_table

KEY_METRICS = ("throughput", "ttft_p50", "ttft_p99", "tpot_mean", "plan_agreement")


def spread_table(reference: Path, others: list[Path], only: list[str] | None = None) -> pd.DataFrame:
    """One row per (workload, other set) for every workload the reference and that set both hold (subdirectories
    with summary.json), `only` restricting them: compare(other/w, reference/w), with columns workload and run."""
    rows = []
    for other in others:
        names = sorted(p.name for p in reference.iterdir() if (p / "summary.json").exists()
                       and (other / p.name / "summary.json").exists() and (only is None or p.name in only))
        table = error_table({name: (other / name, reference / name) for name in names})
        rows.append(table.rename(columns={"run": "workload"}).assign(run=str(other)))
    if not rows or all(r.empty for r in rows):
        raise ValueError(f"no workload is in both {reference} and {', '.join(map(str, others))}")
    frame = pd.concat(rows, ignore_index=True)
    return frame[["workload", "run"] + [c for c in frame.columns if c not in ("workload", "run")]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", type=Path)
    parser.add_argument("others", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    table = spread_table(args.reference, args.others, args.only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.round(4).to_csv(args.out, index=False)
    with pd.option_context("display.width", 200):
        print(table[["workload", *KEY_METRICS]].round(4).to_string(index=False))


if __name__ == "__main__":
    main()
