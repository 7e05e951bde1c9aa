"""Spawn a few gloo ranks on CPU running a test function; collect what each returns."""
from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any, Callable

from runtime.distributed.groups import RankInfo, destroy, init_rank_groups
from runtime.distributed.launch import free_port


def _target(fn: Callable, info: RankInfo, args: tuple, out) -> None:
    import torch
    torch.set_num_threads(1)
    try:
        groups = init_rank_groups(info)
        out.put((info.rank, "ok", _plain(fn(info, groups, *args))))
    except BaseException as err:   # noqa: BLE001
        import traceback
        out.put((info.rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        destroy()


def _plain(value: Any) -> Any:
    """Tensors as numpy arrays: a queue would share a tensor's memory with a process about to exit."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def run_ranks(fn: Callable, world: int, *args: Any, tp: int | None = None, ep: int = 1,
              timeout_s: float = 240.0) -> list[Any]:
    """fn(info, groups, *args) on `world` CPU ranks (tp = world unless given); results by rank, tensors
    returned as numpy arrays."""
    tp = tp or world
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in range(world):
        info = RankInfo(rank, world, rank, tp, ep, world // tp, init, "gloo", "cpu", 120.0)
        procs.append(ctx.Process(target=_target, args=(fn, info, args, out), daemon=True))
        procs[-1].start()
    results: dict[int, Any] = {}
    try:
        while len(results) < world:
            try:
                rank, status, value = out.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results))} did not report") from None
            if status == "error":
                raise RuntimeError(f"rank {rank}: {value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]
