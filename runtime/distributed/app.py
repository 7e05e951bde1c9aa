"""`mode=real` over several processes (tp/ep/dp): one process per GPU (or CPU rank with gloo), spawned
from the launching process, which is also the DP router and the ranks' watchdog.

Design. The scheduler is torch-free and runs once per DP replica, on the replica's TP leader (tp rank
0); each step the leader broadcasts the runner's StepInputs (the host half of the batch: token ids,
slots, slot-table updates, sampling rows) over a gloo CPU group, and every rank of the group runs the
same forward on its shard (NCCL collectives on GPU). Broadcasting the plan rather than running
identical schedulers on every rank keeps one source of truth for admission, eviction and retraction
(no cross-rank drift to guard against) and puts no scheduler work on the other ranks. Every rank
samples (the logits are gathered whole on each; same seed, same calls, same tokens), so the tokens of
step n are already in every rank's future ring when step n+1 reads them and no rank waits for another's
host: only the leader copies tokens to its host. With dp > 1 the router (runtime/core/router) runs here:
requests are routed on the wall clock as they arrive, each replica reports requests that leave it
(the router's load signal), and the replicas' records are merged with a `replica` column as in
`mode=sim`. More than one node: `nnodes`, `node_rank`, `dist_init_addr` (each node spawns its share
of the ranks; node 0 holds the leader and writes the records). DP attention (`dp_attention=true`, MLA
models): the dp replicas are attention ranks inside the tp GPUs, each led by its attention TP leader
with the router in front as for dp; their leaders step in lockstep (runtime.distributed.lockstep) and
the MLP/MoE runs over all tp GPUs on every rank's tokens (runtime.distributed.dp_attention). Decode
steps replay CUDA graphs captured at the padded per-rank row count: each round every GPU replays the
size its leaders agreed on (runtime.dp_attention_graphs), and steps with a prefill run eagerly.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from runtime.build import CoreComponents, build_core, check_workload_fits, dp_attention_active
from runtime.core.request import RequestSpec
from runtime.distributed.groups import RankInfo
from runtime.distributed.launch import RankProcesses, free_port
from runtime.distributed.sources import END, GO
from runtime.distributed.worker import LeaderResult, RankTask
from runtime.driver import all_at_once
from runtime.metrics import step_prediction_error, summarize
from runtime.run_mode import publish
from sim.step_shapes import write_step_shapes

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class NodePlan:
    """Which ranks this node runs, where they meet and on which backend."""

    world_size: int
    first_rank: int
    num_local: int
    init_method: str
    backend: str
    device_type: str          # cuda | cpu


def check_layout(core: CoreComponents, nnodes: int) -> None:
    layout = core.layout
    if layout.pp > 1:
        raise ValueError(f"pp={layout.pp}: pipeline parallelism runs in mode=sim only; mode=real takes tp, ep and dp")
    if layout.dp_attention and not core.model.is_mla:
        raise ValueError(f"dp_attention in mode=real needs an MLA model (DeepSeek); {core.model.name} is not "
                         "(mode=sim takes it)")
    if layout.dp > 1 and nnodes > 1:
        raise ValueError(f"dp={layout.dp} with nnodes={nnodes}: DP replicas run on one node for now")


def node_plan(cfg: DictConfig, core: CoreComponents) -> NodePlan:
    """Ranks of this node (`nnodes` split the world evenly), the rendezvous and the device: CUDA when
    `real.device` allows and this node has a GPU per local rank, else CPU with gloo."""
    world = core.layout.num_gpus
    nnodes, node_rank = int(cfg.get("nnodes", 1)), int(cfg.get("node_rank", 0))
    if world % nnodes or not 0 <= node_rank < nnodes:
        raise ValueError(f"{world} ranks cannot be split over nnodes={nnodes} (node_rank={node_rank})")
    num_local = world // nnodes
    addr = cfg.get("dist_init_addr")
    if nnodes > 1 and not addr:
        raise ValueError("nnodes > 1 needs dist_init_addr=HOST:PORT (node 0's address, reachable from every node)")
    init_method = f"tcp://{addr}" if addr else f"tcp://127.0.0.1:{free_port()}"
    requested = str(cfg.real.device)
    import torch   # device discovery only; the ranks initialise CUDA themselves
    visible = torch.cuda.device_count()
    if requested.startswith("cuda") or (requested == "auto" and visible > 0):
        if visible < num_local:
            raise ValueError(f"tp={core.layout.tp} dp={core.layout.dp} needs {num_local} GPUs on this node; "
                             f"{visible} visible (real.device=cpu runs the layout on CPU with gloo)")
        return NodePlan(world, node_rank * num_local, num_local, init_method, "nccl", "cuda")
    return NodePlan(world, node_rank * num_local, num_local, init_method, "gloo", "cpu")


def resolved_config(cfg: DictConfig, out_dir: str | Path | None) -> dict:
    """The config as plain data for the ranks (they have no Hydra context to resolve `${hydra:...}`)."""
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.output_dir = str(out_dir) if out_dir is not None else str(cfg.output_dir)
    return OmegaConf.to_container(cfg, resolve=True)


def make_tasks(cfg: DictConfig, core: CoreComponents, plan: NodePlan, context, out_dir: str | Path,
               collect_output_ids: bool, specs: list[RequestSpec] | None) -> tuple[list[RankTask], object]:
    data = resolved_config(cfg, out_dir)
    out_queue = context.Queue()
    timeout_s = float(cfg.real.get("dist_timeout_s", DEFAULT_TIMEOUT_S))
    cpu_threads = max(1, (os.cpu_count() or 1) // plan.num_local)
    tasks = []
    for rank in range(plan.first_rank, plan.first_rank + plan.num_local):
        local = rank - plan.first_rank
        device = f"cuda:{local}" if plan.device_type == "cuda" else "cpu"
        info = RankInfo(rank, plan.world_size, local, core.layout.tp, core.layout.ep, core.layout.dp,
                        plan.init_method, plan.backend, device, timeout_s, dp_attention_active(core.layout),
                        bool(cfg.real.get("nccl_graph_mixing", False)))
        inbox = context.Queue() if core.layout.dp > 1 and info.is_leader else None
        tasks.append(RankTask(info, data, out_queue, inbox, cpu_threads, collect_output_ids,
                              specs if core.layout.dp == 1 and info.is_leader else None))
    return tasks, out_queue


class Dispatcher:
    """The DP router on the wall clock: routes each request once its arrival time has passed (all at
    once for `as_fast_as_possible`), into the chosen replica's inbox; then END to every replica."""

    def __init__(self, specs: list[RequestSpec], router, inboxes: list, clock=time.perf_counter) -> None:
        self.specs = sorted(specs, key=lambda s: (s.arrival_s, s.rid))
        self.router, self.inboxes, self.clock = router, inboxes, clock
        self.next_idx, self.origin = 0, None
        self.routed_per_replica = [0] * len(inboxes)

    def start(self) -> None:
        for inbox in self.inboxes:
            inbox.put(GO)
        self.origin = self.clock()

    def route_due(self) -> float | None:
        """Route what has arrived; returns seconds until the next arrival (None: all routed)."""
        now = self.clock() - self.origin
        while self.next_idx < len(self.specs) and self.specs[self.next_idx].arrival_s <= now:
            spec = self.specs[self.next_idx]
            self.next_idx += 1
            replica = self.router.route(spec, now)
            self.inboxes[replica].put(spec)
            self.routed_per_replica[replica] += 1
            if self.next_idx == len(self.specs):
                for inbox in self.inboxes:
                    inbox.put(END)
        if self.next_idx >= len(self.specs):
            return None
        return max(0.0, self.specs[self.next_idx].arrival_s - now)

    def finished(self, replica: int, count: int) -> None:
        for _ in range(count):
            self.router.finish(replica)


def serve(cfg: DictConfig, out_dir: str | Path, collect_output_ids: bool = False,
          specs: list[RequestSpec] | None = None):
    """Spawn this node's ranks, route (dp > 1), wait for every leader's records. Returns the leaders'
    results by replica (node 0), the rank processes' pids and the dispatcher (dp > 1, else None).
    `specs`: the requests to serve (default: the config's workload). Raises RankFailed if a rank dies."""
    core = build_core(cfg)
    nnodes = int(cfg.get("nnodes", 1))
    check_layout(core, nnodes)
    if core.layout.dp > 1:                     # the router here routes them: loaded (and checked) before any spawn
        specs = specs if specs is not None else instantiate(cfg.workload).requests()
        check_workload_fits(core, specs)
    plan = node_plan(cfg, core)
    context = mp.get_context("spawn")
    tasks, out_queue = make_tasks(cfg, core, plan, context, out_dir, collect_output_ids, specs)
    procs = RankProcesses(tasks, out_queue, context)
    dispatcher = None
    try:
        procs.start()
        _wait_ready(procs, len(tasks), out_dir)
        leaders = [t for t in tasks if t.info.is_leader]
        if core.layout.dp > 1:
            if cfg.real.as_fast_as_possible:
                specs = all_at_once(specs)
            router = instantiate(cfg.router)(num_replicas=core.layout.dp)
            dispatcher = Dispatcher(specs, router, [t.inbox for t in leaders])
            dispatcher.start()
        results: dict[int, LeaderResult] = {}
        pending_done = len(tasks)
        while pending_done:
            wait_s = dispatcher.route_due() if dispatcher is not None else None
            message = procs.next_message(0.5 if wait_s is None else min(wait_s, 0.5))
            if message is None:
                continue
            if message[0] == "finished" and dispatcher is not None:
                dispatcher.finished(message[1], message[2])
            elif message[0] == "done":
                pending_done -= 1
                if isinstance(message[2], LeaderResult):
                    results[message[2].replica] = message[2]
        procs.join()
    finally:
        procs.stop()
    return results, procs.pids, dispatcher


def run_job(cfg: DictConfig, core: CoreComponents, out_dir: str | Path, job: tuple, label: str,
            job_cfg: dict | None = None):
    """Spawn this node's ranks of one replica with `job` = (lead, follow) instead of serving
    (RankTask.job): the TP leader runs lead(task, cfg, core, runner), the others follow(runner, channel).
    `job_cfg`: keys added to every rank's config. Prints one line naming the ranks (`label` first);
    returns the leader's result. Raises RankFailed if a rank dies or fails."""
    import dataclasses

    plan = node_plan(cfg, core)
    context = mp.get_context("spawn")
    tasks, out_queue = make_tasks(cfg, core, plan, context, out_dir, False, None)
    tasks = [dataclasses.replace(t, cfg={**t.cfg, **(job_cfg or {})}, job=job) for t in tasks]
    print(f"{label}: tp={core.layout.tp} ep={core.layout.ep}: {len(tasks)} ranks ({plan.device_type}, {plan.backend})"
          f" -> {out_dir}", flush=True)
    procs = RankProcesses(tasks, out_queue, context)
    results: dict[int, object] = {}
    try:
        procs.start()
        while len(results) < len(tasks):
            message = procs.next_message(None)      # raises RankFailed when a rank dies or fails
            if message[0] == "done":
                results[message[1]] = message[2]
        procs.join()
    finally:
        procs.stop()
    return results[next(t.info.rank for t in tasks if t.info.is_leader)]


def _wait_ready(procs: RankProcesses, count: int, out_dir: str | Path) -> None:
    """Every rank has built its runner; the run directory then lists the ranks' pids (ranks.json).
    Anything else a rank reports meanwhile is handed back to the message stream."""
    ready, other = 0, []
    while ready < count:
        message = procs.next_message(None)
        if message is not None and message[0] == "ready":
            ready += 1
        elif message is not None:
            other.append(message)
    procs.push_back(other)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "ranks.json").write_text(json.dumps({str(r): pid for r, pid in procs.pids.items()}) + "\n")


def merged_records(results: dict[int, LeaderResult], dp: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One replica: its records as they are. Several: concatenated with a `replica` column, requests by
    arrival then rid, steps by start then replica then step (mode=sim's DP order)."""
    if dp == 1:
        only = results[0]
        return only.requests, only.steps
    requests = pd.concat([results[r].requests.assign(replica=r) for r in range(dp)], ignore_index=True)
    steps = pd.concat([results[r].steps.assign(replica=r) for r in range(dp)], ignore_index=True)
    requests = requests.sort_values(["arrival_s", "rid"], kind="mergesort").reset_index(drop=True)
    steps = steps.sort_values(["start_s", "replica", "step_id"], kind="mergesort").reset_index(drop=True)
    return requests, steps


def merged_shapes(results: dict[int, LeaderResult], steps: pd.DataFrame, dp: int) -> pd.DataFrame | None:
    """The replicas' step shapes in the merged steps' row order (with their `replica` column when dp > 1),
    or None where a leader recorded none (DP attention)."""
    if any(r.shapes is None for r in results.values()):
        return None
    if dp == 1:
        return results[0].shapes
    shapes = pd.concat([results[r].shapes.assign(replica=r) for r in range(dp)], ignore_index=True)
    return steps[["replica", "step_id"]].merge(shapes, on=["replica", "step_id"], how="left")


def run_real_distributed(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """`mode=real` with tp * dp > 1 (or nnodes > 1): writes the same records and summary as one GPU;
    with dp > 1 merged over the replicas with a `replica` column and a `dp` summary section."""
    wall_start = time.perf_counter()
    out_dir = out_dir or cfg.output_dir
    results, pids, dispatcher = serve(cfg, out_dir)
    if not results:                                   # a node without a leader: nothing to write
        return {"node_rank": int(cfg.get("node_rank", 0)), "ranks": sorted(pids)}
    core_layout = build_core(cfg).layout
    dp = core_layout.dp
    requests, steps = merged_records(results, dp)
    summary = summarize(requests, steps, mode="real", wall_time_s=time.perf_counter() - wall_start)
    facts = {k: v for k, v in results[0].facts.items()
             if k not in ("idle_steps", "lockstep_rounds", "graph_steps", "graph_replays", "piecewise_replays")}
    summary.update(facts, leaked_kv_slots=sum(r.facts["leaked_kv_slots"] for r in results.values()),
                   load_time_s=max(r.facts["load_time_s"] for r in results.values()),
                   step_prediction_error=step_prediction_error(steps))
    summary["layout"] = {"tp": core_layout.tp, "ep": core_layout.ep, "dp": dp, "num_ranks": len(pids),
                         "nnodes": int(cfg.get("nnodes", 1))}
    if core_layout.dp_attention:
        summary["layout"]["dp_attention"] = True
    if dp > 1:
        summary["dp"] = {
            "replicas": dp, "dp_attention": core_layout.dp_attention, "num_gpus": core_layout.num_gpus,
            "router": type(dispatcher.router).__name__,
            "requests_per_replica": requests.groupby("replica").size().reindex(range(dp), fill_value=0).tolist(),
            "steps_per_replica": steps.groupby("replica").size().reindex(range(dp), fill_value=0).tolist(),
        }
        if dp_attention_active(core_layout):     # rounds every leader joined; idle: its MLP share only
            summary["dp"]["idle_steps_per_replica"] = [results[r].facts["idle_steps"] for r in range(dp)]
            summary["dp"]["lockstep_rounds"] = results[0].facts["lockstep_rounds"]
            # rounds every GPU replayed one decode graph (padded to the agreed size), per attention rank
            summary["dp"]["graph_steps_per_replica"] = [results[r].facts["graph_steps"] for r in range(dp)]
    # the stall check ran on every leader (RealDriver.serve); leaked slots come summed from their facts
    run_dir = publish(cfg, out_dir, requests, steps, summary,
            note=f"tp={core_layout.tp} ep={core_layout.ep} dp={dp}"
                 f"{' dp_attention' if dp_attention_active(core_layout) else ''}: {len(pids)} ranks ({facts['device']} on rank 0)"
                 + (f"  router={summary['dp']['router']}  requests per replica {summary['dp']['requests_per_replica']}"
                    if dp > 1 else ""))
    shapes = merged_shapes(results, steps, dp)
    if shapes is not None:
        write_step_shapes(run_dir, shapes)
    return summary
