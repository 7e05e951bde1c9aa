"""The simulator's SimPy environment, whose waits land exactly on a given time. SimPy sets `now` to
now + delay, and now + (t - now) can miss t by an ulp (and for some pairs no delay hits t), so two
paths that wait for the same time could see different clocks. Imports only simpy."""
from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import NORMAL


class ExactClock(simpy.Environment):
    """simpy.Environment plus `timeout_until(t_s)`: an event after which `now == t_s`, bit for bit.
    It enters SimPy's event queue as `Environment.schedule` does, with the absolute time in place of
    now + delay (simpy 4's queue entries: time, priority, event id, event)."""

    def timeout_until(self, t_s: float) -> simpy.Event:
        """An event after which now == t_s exactly (at once if t_s is not after now)."""
        if t_s <= self.now:
            return self.timeout(0.0)
        event = simpy.Event(self)
        event._ok, event._value = True, None             # triggered as Event.succeed() does
        heappush(self._queue, (t_s, NORMAL, next(self._eid), event))
        return event
