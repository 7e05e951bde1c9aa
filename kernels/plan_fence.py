"""Orders FlashInfer plan() calls: plan() stages its schedule in a pinned host buffer that it copies
to the device asynchronously, so under overlap scheduling the next step's plan() may run while the
previous copy is still queued. `wait()` before planning, `mark()` after. Imports torch only."""
from __future__ import annotations

import torch


class PlanFence:
    def __init__(self) -> None:
        self._planned: torch.cuda.Event | None = None   # recorded after the last plan()

    def wait(self) -> None:
        """Let the previous plan's staged copy land before its host buffer is rewritten."""
        if self._planned is not None:
            self._planned.synchronize()

    def mark(self) -> None:
        self._planned = torch.cuda.Event()
        self._planned.record()
