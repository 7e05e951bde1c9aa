"""Samples every logical CPU's clock (/proc/cpuinfo "cpu MHz") and the host's CPU time split (/proc/stat: user,
system, idle, steal) at a fixed period, with time.perf_counter readings (CLOCK_MONOTONIC, the clock of
launch_times.parquet's clock_origin_s), into a CSV until it is stopped: what the host's CPUs did while a run
launched its steps (experiments/gpu_jobs/host_regimes.sh). Linux only; standard library only.

  python experiments/cpu_clock_sampler.py OUT.csv [--period-s 0.2]
"""
from __future__ import annotations

import argparse
import csv
import signal
import time
from pathlib import Path

STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_mhz(cpuinfo: str) -> list[float]:
    """Every logical CPU's "cpu MHz" in /proc/cpuinfo's order (empty where the kernel does not report it)."""
    return [float(line.split(":", 1)[1]) for line in cpuinfo.splitlines() if line.startswith("cpu MHz")]


def cpu_times(stat: str) -> dict[int, tuple[int, ...]]:
    """{cpu: jiffies per STAT_FIELDS} from /proc/stat's per-CPU lines (the "cpu" total line left out)."""
    out = {}
    for line in stat.splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            out[int(name[3:])] = tuple(int(v) for v in values[:len(STAT_FIELDS)])
    return out


def sample(out: Path, period_s: float) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t_s", "cpu", "mhz", *STAT_FIELDS])
        while not stop:
            t = time.perf_counter()
            mhz = cpu_mhz(Path("/proc/cpuinfo").read_text())
            times = cpu_times(Path("/proc/stat").read_text())
            for cpu, jiffies in sorted(times.items()):
                writer.writerow([f"{t:.4f}", cpu, mhz[cpu] if cpu < len(mhz) else "", *jiffies])
            fh.flush()
            time.sleep(period_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--period-s", type=float, default=0.2)
    args = parser.parse_args()
    try:
        sample(args.out, args.period_s)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
