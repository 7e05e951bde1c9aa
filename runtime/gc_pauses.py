"""Python's garbage collections while a process serves: how many and how long (gc.callbacks), each one
longer than a threshold logged (SGLang's --gc-warning-threshold-secs); and, for the time of the run, every
object alive after start-up moved to the permanent generation (gc.freeze, as SGLang's /freeze_gc), so that
collections while serving no longer scan the model, its graphs and caches. Imports nothing of the project.
"""
from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def serving_gc(pauses: "GCPauses", freeze: bool) -> Iterator["GCPauses"]:
    """The block serves: with `freeze`, collect once and freeze what is left (unfrozen on exit, so a
    process that goes on -- a test, a notebook -- collects it again); `pauses` records the collections."""
    if freeze:
        gc.collect()
        gc.freeze()
    pauses.frozen_objects = gc.get_freeze_count()
    pauses.start()
    try:
        yield pauses
    finally:
        pauses.stop()
        if freeze:
            gc.unfreeze()


class GCPauses:
    """Collections between start() and stop(), per generation, with their summed and longest pause.
    `warn_above_s` > 0: a collection longer than that is logged with the generations' object counts."""

    def __init__(self, warn_above_s: float = 0.0) -> None:
        self.warn_above_s = warn_above_s
        self.counts = [0, 0, 0]
        self.total_s = 0.0
        self.max_s = 0.0
        self.long_pauses = 0
        self.frozen_objects = 0             # objects the permanent generation held while recording
        self._started: float | None = None

    def start(self) -> "GCPauses":
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        pause = time.perf_counter() - self._started
        self._started = None
        generation = int(info.get("generation", 2))
        self.counts[min(generation, 2)] += 1
        self.total_s += pause
        self.max_s = max(self.max_s, pause)
        if self.warn_above_s > 0 and pause > self.warn_above_s:
            self.long_pauses += 1
            log.warning("garbage collection of generation %d took %.1f ms (objects per generation %s, %d frozen)",
                        generation, 1e3 * pause, gc.get_count(), gc.get_freeze_count())

    def summary(self) -> dict:
        """For the run summary (JSON): collections per generation, pause seconds summed and longest."""
        return {"collections": {f"gen{g}": n for g, n in enumerate(self.counts)},
                "pause_total_s": self.total_s, "pause_max_s": self.max_s, "long_pauses": self.long_pauses,
                "frozen_objects": self.frozen_objects}
