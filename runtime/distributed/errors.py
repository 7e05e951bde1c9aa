"""The error a multi-process run ends with when one of its ranks dies or fails. Torch-free (run.py
imports it to print it in one line)."""
from __future__ import annotations


class RankFailed(RuntimeError):
    """A rank died (signal, non-zero exit) or raised; the message names it, and the other ranks
    were stopped."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank
