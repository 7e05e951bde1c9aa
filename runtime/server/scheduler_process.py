"""The scheduler process of the server: the core scheduler and the model runner driven by the same
real-time loop as `mode=real` (RealDriver), fed by an OnlineSource; answers control requests
between steps and writes the run's records on shutdown. Imports torch (through the runner).
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from runtime.gc_pauses import GCPauses, serving_gc
from runtime.server.ipc import Addresses, ControlReply, ControlReq, Ready


class SchedulerControl:
    """Answers the HTTP process's control requests; runs inside `OnlineSource.poll`, between steps."""

    def __init__(self, scheduler, out_dir: str, started_s: float) -> None:
        self.scheduler = scheduler
        self.source = self.driver = None        # set once built (the source calls this object)
        self.out_dir = out_dir
        self.started_s = started_s

    def __call__(self, msg: ControlReq) -> ControlReply:
        handler = {"flush_cache": self.flush_cache, "server_info": self.server_info,
                   "dump_records": self.dump_records, "abort": self.abort}.get(msg.kind)
        if handler is None:
            return ControlReply(msg.kind, msg.req_id, False, f"unknown control request {msg.kind!r}", msg.worker)
        ok, payload = handler(**msg.args)
        return ControlReply(msg.kind, msg.req_id, ok, payload, msg.worker)

    def abort(self, rids: list[str] | None = None) -> tuple[bool, object]:
        """/abort_request (None: all): the requests found, which end at the next step for their clients."""
        return True, self.source.abort_for_clients(rids)

    def flush_cache(self) -> tuple[bool, object]:
        s = self.scheduler
        if s.has_work() or self.source.tracked:
            return False, f"{len(self.source.tracked)} requests in flight"
        freed = s.kv.cache.total_size()
        s.kv.cache.reset()
        return True, freed

    def server_info(self) -> tuple[bool, object]:
        s, source = self.scheduler, self.source
        used, cached = s.kv.used_tokens(), s.kv.cache.total_size()
        return True, {"num_running": len(s.running), "num_waiting": len(s.waiting),
                      "num_chunked": int(s.chunked is not None), "num_in_flight": len(source.tracked),
                      "num_finished": len(source.finished), "kv_capacity_tokens": s.kv.capacity_tokens,
                      "kv_used_tokens": used, "radix_cache_tokens": cached,
                      "kv_tokens_held_by_requests": used - cached, "num_steps": s.step_id,
                      "pid": os.getpid()}

    def dump_records(self, dir: str | None = None, rids: list[str] | None = None) -> tuple[bool, object]:
        steps = getattr(self.driver, "steps", None)   # the driver's StepLog, when it keeps one
        requests, steps = without_warmup(self.source.finished, steps)
        if rids is not None:                               # the last request of each id asked for
            wanted = set(rids)
            requests = list({r.rid: r for r in requests if r.rid in wanted}.values())
        if steps is not None and rids is not None:
            steps = steps_since(steps, min((r.arrival_s for r in requests), default=float("inf")))
        out, summary = write_records(requests, steps, dir or self.out_dir, time.perf_counter() - self.started_s)
        return True, {"dir": str(out), "summary": summary}


def without_warmup(requests, steps):
    """The run's requests and steps without the server's warm-up (`ipc.is_warmup`): the steps from the first
    other request's arrival on (the warm-up ends before the server accepts clients; under overlap scheduling
    its last step may start after its finish)."""
    from runtime.server.ipc import is_warmup

    if not any(is_warmup(r.rid) for r in requests):
        return list(requests), steps
    kept = [r for r in requests if not is_warmup(r.rid)]
    first_arrival_s = min((r.arrival_s for r in kept), default=float("inf"))
    return kept, (steps_since(steps, first_arrival_s) if steps is not None else None)


def steps_since(steps, start_s: float):
    """A StepLog of the steps that started at or after `start_s`."""
    from runtime.core.records import StepLog

    keep = [i for i, t in enumerate(steps.columns["start_s"]) if t >= start_s]
    out = StepLog()
    for name, values in steps.columns.items():
        out.columns[name] = [values[i] for i in keep]
    return out


def warm_record_writing() -> None:
    """Write an empty run's records once, before the start-up objects are frozen: the modules a dump loads on
    first use (pandas, pyarrow and theirs: tens of thousands of objects) would otherwise be imported while
    serving, outside the frozen generation, and walked by every full garbage collection after the first
    /dump_records (65-84 ms stalls between steps on the H200)."""
    import tempfile

    from runtime.core.records import StepLog

    with tempfile.TemporaryDirectory(prefix="twinserve-warm-records-") as tmp:
        write_records([], StepLog(), tmp, 0.0)


def write_records(requests, steps, out_dir: str | Path, wall_time_s: float, plots: bool = False,
                  extra: dict | None = None):
    """requests.parquet, steps.parquet (empty when `steps` is None) and summary.json of a served run (plus
    the `extra` summary fields)."""
    from runtime.core.records import StepLog
    from runtime.metrics import summarize
    from runtime.records_io import requests_frame, steps_frame, write_run

    req_frame, step_frame = requests_frame(list(requests)), steps_frame(steps if steps is not None else StepLog())
    summary = summarize(req_frame, step_frame, mode="serve", wall_time_s=wall_time_s)
    if steps is None:                                  # the driver's step log is complete only at shutdown
        summary.update(num_steps=None, num_retractions=None)
    summary.update(extra or {})
    out = write_run(out_dir, req_frame, step_frame, summary, plots=plots)
    return out, summary


def run_scheduler(cfg_container: dict, addresses: Addresses, parent_pid: int) -> None:
    """Process entry: build, announce Ready, serve until shutdown, write the records, say goodbye. Outputs,
    control replies and Ready go to the detokenizer process (requests' first outputs to their workers too, with
    server.first_outputs_direct), or (server.detokenizer=inline) to the workers."""
    from runtime.build import build_core
    from runtime.driver import RealDriver
    from runtime.engine.build_runner import build_model_runner
    from runtime.server.hop_trace import HopTrace
    from runtime.server.channel import Inbox, Outbox
    from runtime.server.ipc import WorkerPushes
    from runtime.server.online_source import OnlineSource
    from runtime.server.process_utils import child_process_setup
    from runtime.server.tokenizer import load_tokenizer

    child_process_setup("twinserve-sched")
    cfg = OmegaConf.create(cfg_container)
    pull = Inbox(addresses.scheduler, busy_poll_s=float(cfg.server.busy_poll_s or 0.0))
    direct = None
    if cfg.server.detokenizer == "inline":     # no detokenizer process: outputs straight to their workers
        push = WorkerPushes(addresses, int(cfg.server.tokenizer_workers))
    else:
        push = Outbox(addresses.detokenizer)
        if cfg.server.first_outputs_direct:    # first outputs to their workers too, a hop less to first token
            direct = WorkerPushes(addresses, int(cfg.server.tokenizer_workers))
    trace = HopTrace.from_env("scheduler")
    try:
        started = time.perf_counter()
        core = build_core(cfg)
        runner = build_model_runner(cfg, core)
        tokenizer = load_tokenizer(cfg.tokenizer.path, core.model.vocab_size)
        control = SchedulerControl(core.scheduler, cfg.output_dir, started)
        control.source = source = OnlineSource(pull, push, core.scheduler, tokenizer, control, parent_pid=parent_pid,
                                                     stream_interval=int(cfg.server.stream_interval), trace=trace,
                                                     direct=direct)
        control.driver = driver = RealDriver(core.scheduler, runner, progress=False, overlap=bool(cfg.overlap))
        push.send_pyobj(Ready(core.kv_capacity_tokens, core.model.max_context_tokens, core.model.vocab_size,
                              str(runner.device), os.getpid()))
        pauses = GCPauses(float(cfg.real.gc_warning_threshold_s))
        if cfg.real.freeze_gc:
            warm_record_writing()                    # its modules' objects are frozen with the rest, below
        with serving_gc(pauses, bool(cfg.real.freeze_gc)):
            outcome = driver.serve(source)
        source.flush()
        requests, steps = without_warmup(outcome.requests, outcome.steps)
        out, summary = write_records(requests, steps, cfg.output_dir,
                                     time.perf_counter() - started, plots=False, extra={"gc": pauses.summary()})
        shutdown = source.shutdown
        push.send_pyobj(ControlReply("shutdown", shutdown.req_id if shutdown else -1, True,
                                     {"dir": str(out), "summary": summary}, shutdown.worker if shutdown else 0))
    except Exception:
        traceback.print_exc()
        push.send_pyobj(ControlReply("shutdown", -1, False, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if trace is not None:
            trace.flush()
        pull.close()
        push.close(2000)
        if direct is not None:
            direct.close(2000)
