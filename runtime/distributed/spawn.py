"""Run one function on N freshly spawned ranks of one node and collect what each returns (benchmarks
and tests of the parallel layers; serving goes through runtime.distributed.app). Each rank joins the
process groups first (runtime.distributed.groups), so `fn(info, groups, *args)` can build sharded
models and use collectives; tensors come back as numpy arrays.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from typing import Any, Callable

from runtime.distributed.groups import RankInfo, init_rank_groups
from runtime.distributed.launch import free_port
from runtime.distributed.worker import die_with_parent, hand_over_and_tear_down


def _plain(value: Any) -> Any:
    """Tensors as numpy arrays: a queue would share a tensor's memory with a process about to exit."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _target(fn: Callable, info: RankInfo, args: tuple, out, cpu_threads: int) -> None:
    import torch
    die_with_parent()
    if info.device == "cpu":
        torch.set_num_threads(cpu_threads)
    else:
        torch.cuda.set_device(torch.device(info.device))
    try:
        groups = init_rank_groups(info) if info.world_size > 1 else None
        message = (info.rank, "ok", _plain(fn(info, groups, *args)))
    except BaseException as err:   # noqa: BLE001 -- reported to the caller
        message = (info.rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
    hand_over_and_tear_down(out, message, 0)


def run_on_ranks(fn: Callable, world: int, *args: Any, tp: int | None = None, ep: int = 1, device: str = "cpu",
                 timeout_s: float = 600.0, cpu_threads: int = 1, dp_attention: int = 0,
                 graph_mixing: bool = False) -> list[Any]:
    """fn(info, groups, *args) on `world` ranks (tp = world unless given; device "cpu" with gloo, or
    "cuda" with NCCL, rank r on cuda:r); their results by rank. A rank's exception is raised here.
    dp_attention=D: the world is one tp group of D attention ranks (SGLang's --enable-dp-attention).
    graph_mixing: NCCL's graph mixing support (real.nccl_graph_mixing)."""
    tp = tp or world
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    backend = "nccl" if device == "cuda" else "gloo"
    procs = []
    for rank in range(world):
        info = RankInfo(rank, world, rank, tp, ep, dp_attention or world // tp, init, backend,
                        f"cuda:{rank}" if device == "cuda" else "cpu", timeout_s, dp_attention > 0, graph_mixing)
        procs.append(ctx.Process(target=_target, args=(fn, info, args, out, cpu_threads), daemon=True))
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
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]
