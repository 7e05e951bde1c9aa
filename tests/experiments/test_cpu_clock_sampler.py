"""experiments/cpu_clock_sampler.py parses /proc/cpuinfo's clocks and /proc/stat's per-CPU times."""
from __future__ import annotations

from experiments.cpu_clock_sampler import cpu_mhz, cpu_times

CPUINFO = "processor\t: 0\ncpu MHz\t\t: 2400.000\n\nprocessor\t: 1\ncpu MHz\t\t: 3701.5\n"
STAT = ("cpu  10 0 5 100 0 0 0 2 0 0\ncpu0 4 0 2 50 0 0 0 1 0 0\ncpu1 6 0 3 50 0 0 0 1 0 0\n"
        "intr 123\nctxt 456\n")


def test_clocks_come_in_cpu_order():
    assert cpu_mhz(CPUINFO) == [2400.0, 3701.5]


def test_per_cpu_times_leave_out_the_total_and_other_lines():
    times = cpu_times(STAT)
    assert sorted(times) == [0, 1]
    assert times[1] == (6, 0, 3, 50, 0, 0, 0, 1)      # user nice system idle iowait irq softirq steal
