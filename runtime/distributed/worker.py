"""One rank of a multi-process `mode=real` run (the spawn target): join the process groups, build
this rank's shard of the model runner, then either lead its TP group (scheduler + driver; each step's
inputs broadcast to the group) or follow it (run every step the leader sends). Under DP attention the
groups are attention TP groups and their leaders step in lockstep (runtime.distributed.lockstep).
Reports to the launching process through one queue: ("ready", rank, pid), ("finished", replica, n),
("done", rank, result) or ("error", rank, (type name, message, traceback)).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from runtime.distributed.groups import RankInfo, destroy
from runtime.gc_pauses import GCPauses, serving_gc

USER_ERRORS = (ValueError, FileNotFoundError)
TEARDOWN_S = 20.0          # how long a finished rank waits for its process groups to be destroyed


@dataclass
class RankTask:
    info: RankInfo
    cfg: dict                 # the run's config, resolved (workers have no Hydra context)
    out_queue: Any            # rank -> launcher messages
    inbox: Any = None         # launcher (router) -> a DP replica's leader: GO, RequestSpecs, END
    cpu_threads: int = 1      # torch intra-op threads of a CPU rank (ranks share the node's cores)
    collect_output_ids: bool = False   # leaders also return every request's generated tokens (tests)
    specs: list | None = None # the requests to serve (dp=1); None = the config's workload
    # instead of serving (dp=1, no DP attention): (lead, follow), module-level functions. The leader runs
    # lead(task, cfg, core, runner), its runner handing each launched step to the group; the other ranks
    # run follow(runner, channel) until the leader's STOP. What each returns is its "done" result.
    job: tuple | None = None


@dataclass
class LeaderResult:
    """What a TP leader hands back: its replica's records and the run facts the summary reports."""

    replica: int
    requests: Any             # pandas DataFrame (requests.parquet rows)
    steps: Any                # pandas DataFrame (steps.parquet rows)
    facts: dict
    output_ids: dict | None = None   # rid -> generated token ids (tests)
    shapes: Any = None        # pandas DataFrame (step_shapes.parquet rows); None under DP attention


def rank_main(task: RankTask) -> None:
    """Spawn target. Never returns normally without having put "done" or "error" on the queue.
    `kill -USR1 <pid>` (pids in the run directory's ranks.json) prints the rank's Python stacks, and
    `TWINSERVE_DUMP_STACKS_S=N` in the environment prints them every N seconds."""
    die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    dump_every_s = float(os.environ.get("TWINSERVE_DUMP_STACKS_S", "0") or 0)
    if dump_every_s > 0:       # a rank that may hang: its stacks every N seconds on stderr, unasked
        faulthandler.dump_traceback_later(dump_every_s, repeat=True)
    rank = task.info.rank
    try:
        message = ("done", rank, _run_rank(task))
        status = 0
    except BaseException as err:   # noqa: BLE001 -- reported to the launcher, then this rank exits 1
        user = isinstance(err, USER_ERRORS)
        message, status = ("error", rank, (type(err).__name__, str(err), traceback.format_exc(), user)), 1
    hand_over_and_tear_down(task.out_queue, message, status)
    sys.exit(status)


def hand_over_and_tear_down(out_queue: Any, message: tuple, status: int) -> None:
    """Put a rank's last message on its queue and wait until it is on its way, then destroy the
    process groups; when that does not end within TEARDOWN_S (NCCL's teardown is collective and can
    block for good) the rank leaves at once with `status`: the result is already delivered."""
    out_queue.put(message)
    out_queue.close()
    out_queue.join_thread()
    if not destroy(TEARDOWN_S):
        os._exit(status)


def die_with_parent() -> None:
    """No orphans: the kernel kills this rank if the launcher dies (Linux), and a watcher thread does
    the same elsewhere."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _run_rank(task: RankTask) -> LeaderResult | dict:
    import torch
    from omegaconf import OmegaConf

    from runtime.build import build_core
    from runtime.distributed.dp_attention import dp_attention_parallel
    from runtime.distributed.groups import init_rank_groups
    from runtime.distributed.lockstep import Lockstep
    from runtime.distributed.sharding import SINGLE, ModelParallel
    from runtime.distributed.step_channel import STOP, StepChannel
    from runtime.engine.build_runner import build_model_runner

    info = task.info
    if info.device == "cpu":   # ranks share the cores: intra-op threads beyond a share only spin
        torch.set_num_threads(task.cpu_threads)
    else:                      # Triton, FlashInfer and CUDA events use the current device
        torch.cuda.set_device(torch.device(info.device))
    cfg = OmegaConf.create(task.cfg)
    groups = init_rank_groups(info) if info.tp > 1 else None
    exchange = None
    if info.dp_attention:
        parallel, exchange = dp_attention_parallel(info, groups)
    else:
        parallel = ModelParallel(info.tp_rank, info.tp, info.ep, groups.comm()) if groups else SINGLE
    core = build_core(cfg)            # every rank: KV capacity and table sizes; only the leader schedules
    runner = build_model_runner(cfg, core, parallel=parallel, device=info.device)
    ready = lambda: task.out_queue.put(("ready", info.rank, os.getpid()))   # noqa: E731
    channel = StepChannel(groups.cpu_group, info.leader_rank) if groups and groups.cpu_group is not None else None
    if task.job is not None:
        return _run_job(task, cfg, core, runner, channel, ready)
    pauses = GCPauses(float(cfg.real.gc_warning_threshold_s))
    if not info.is_leader:
        ready()
        with serving_gc(pauses, bool(cfg.real.freeze_gc)):      # a follower's collection stalls the group too
            return {"steps": follow(runner, channel, exchange), "gc": pauses.summary()}
    lockstep = None
    if exchange is not None:
        lockstep = Lockstep(groups.leaders_group, info.dp, exchange, runner, channel)
    elif channel is not None:
        runner.step_sender = channel.send
    try:
        with serving_gc(pauses, bool(cfg.real.freeze_gc)):
            result = lead(task, cfg, core, runner, channel, ready, lockstep)
        result.facts["gc"] = pauses.summary()
        return result
    finally:
        if channel is not None:
            channel.send(STOP)


def _run_job(task: RankTask, cfg, core, runner, channel, ready) -> Any:
    """`task.job` on this rank: the leader's part (steps handed to the peers, STOP at its end, even a
    failed one) or a follower's."""
    from runtime.distributed.step_channel import STOP

    lead_job, follow_job = task.job
    ready()
    if not task.info.is_leader:
        return follow_job(runner, channel)
    if channel is not None:
        runner.step_sender = channel.send
    try:
        return lead_job(task, cfg, core, runner)
    finally:
        if channel is not None:
            channel.send(STOP)


def follow(runner, channel, exchange=None, control=None) -> int:
    """A rank of a TP (or attention TP) group other than its leader: run every step the leader
    broadcasts, until STOP. Under DP attention a step carries every attention rank's token counts
    (set on the model's `exchange`) and the decode graph the ranks agreed on (set on the runner), and
    none of this group's own tokens for the idle step. `control(message)`: True when it took a message
    that is not a step (a job's own word to its peers, e.g. runtime.profile.timing.EagerDecode)."""
    from runtime.distributed.lockstep import RankStep
    from runtime.distributed.step_channel import KEEPALIVE, STOP

    if exchange is not None:
        runner.set_step_graph(None)        # replay only what the ranks agree on
    steps = 0
    while True:
        message = channel.recv()
        if message == STOP:
            return steps
        if message == KEEPALIVE:
            continue
        if control is not None and control(message):
            continue
        if isinstance(message, RankStep):
            exchange.set_step_tokens(message.step_tokens)
            runner.set_step_graph(message.graph_bs)
            if message.inputs is None:
                runner.idle_step()
                continue
            message = message.inputs
        runner.run(message)
        steps += 1


def graph_replay_counts(runner) -> tuple[int, int]:
    """(decode graph replays, piecewise extend replays) of `runner` so far."""
    return (runner.graphs.num_replays if runner.graphs is not None else 0,
            runner.piecewise.num_replays if runner.piecewise is not None else 0)


def lead(task: RankTask, cfg, core, runner, channel, ready, lockstep=None) -> LeaderResult:
    """The TP leader: the scheduler and the real-time driver of one DP replica, over a replay of the
    workload (dp=1) or the router's inbox (dp > 1). `ready()` reports it set up: the router starts its
    clock once every rank has, so the driver's clock starts with it (not after loading a cost model).
    Under DP attention (`lockstep`) the driver runs steps through a LockstepExecutor and idles through
    a LockstepSource, and the steps' predictions price every rank's step of the round together, as the
    simulator's DP attention driver does."""
    from hydra.utils import instantiate

    from runtime.app import leaked_slots
    from runtime.distributed.lockstep import LockstepExecutor, LockstepSource
    from runtime.distributed.sources import GO, InboxSource, KeepAliveSource
    from runtime.distributed.step_channel import KEEPALIVE
    from runtime.driver import RealDriver
    from runtime.records_io import requests_frame, steps_frame
    from runtime.request_source import ReplaySource
    from sim.predictor import build_cost_model, dp_attention_cost_model, step_predictor
    from sim.step_shapes import shapes_frame

    info = task.info
    executor = runner
    shapes: list[dict] | None = None          # under DP attention a step's price needs every rank's shape
    if lockstep is None:
        shapes = []
        predict = step_predictor(build_cost_model(cfg, core), overlap=bool(cfg.overlap), shapes=shapes)
    else:
        executor = LockstepExecutor(runner, lockstep)
        predict = executor.predictor(dp_attention_cost_model(cfg, core))
    driver = RealDriver(core.scheduler, executor, as_fast_as_possible=bool(cfg.real.as_fast_as_possible),
                        progress=bool(cfg.progress) and info.dp == 1, overlap=bool(cfg.overlap), predict=predict)
    ready()
    if task.inbox is None:
        specs = task.specs if task.specs is not None else instantiate(cfg.workload).requests()
        source, total = ReplaySource(specs, all_at_once=driver.as_fast_as_possible, sleep=time.sleep), len(specs)
    else:
        report = lambda replica, n: task.out_queue.put(("finished", replica, n))   # noqa: E731
        source, total = InboxSource(task.inbox, info.replica, report), None
        if task.inbox.get() != GO:
            raise RuntimeError(f"replica {info.replica}: expected the router's start message")
    if lockstep is not None:
        source = LockstepSource(source, lockstep, core.scheduler.has_work)
    if channel is not None:
        source = KeepAliveSource(source, lambda: channel.send(KEEPALIVE), info.timeout_s / 4)
    replays_before = graph_replay_counts(runner)                                      # warm-up's
    outcome = driver.serve(source, total=total)
    replays, piecewise_replays = (n - before for n, before in zip(graph_replay_counts(runner), replays_before))
    facts = dict(kv_capacity_tokens=core.kv_capacity_tokens, load_time_s=runner.load_time_s,
                 warmup_s=runner.warmup_s, device=str(runner.device), leaked_kv_slots=leaked_slots(core.scheduler),
                 graph_replays=replays, piecewise_replays=piecewise_replays)
    if lockstep is not None:
        facts.update(lockstep_rounds=lockstep.rounds, idle_steps=lockstep.idle_steps,
                     graph_steps=lockstep.graph_steps)
    outputs = ({r.rid: list(r.output_ids) for r in outcome.requests}
               if task.collect_output_ids else None)
    return LeaderResult(info.replica, requests_frame(outcome.requests), steps_frame(outcome.steps), facts, outputs,
                        shapes_frame(shapes) if shapes is not None else None)
