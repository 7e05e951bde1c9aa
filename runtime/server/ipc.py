"""Messages between the server's processes (pickled over Unix sockets, `channel.py`) and their addresses.

HTTP + tokenizer worker(s) --TokenizedRequest/AbortReq/ControlReq--> scheduler --BatchOutput--> detokenizer
--BatchText--> the worker that sent the request. Control replies travel the same way back to the worker
that asked, after every output sent before them. With server.first_outputs_direct the scheduler also sends
requests' first outputs straight to their workers, which decode them (the detokenizer decodes them too but
does not send them). With server.detokenizer=inline there is no detokenizer process: the scheduler sends each
worker its share of a BatchOutput (`WorkerPushes`), and the worker decodes it. Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from runtime.core.request import SamplingParams


@dataclass(frozen=True)
class Addresses:
    """Socket paths, one Inbox per receiving process, in a private directory. `http` is the
    launcher's: with one tokenizer worker it serves HTTP itself (worker 0); with N it only receives Ready
    and the shutdown reply, and workers 1..N have their own (`worker(i)`)."""

    scheduler: str
    detokenizer: str
    http: str

    @classmethod
    def in_dir(cls, directory: str) -> "Addresses":
        return cls(*(os.path.join(directory, name) for name in ("scheduler", "detokenizer", "http")))

    def worker(self, worker_id: int) -> str:
        return self.http if worker_id == 0 else f"{self.http}-{worker_id}"


def worker_ids(num_workers: int) -> list[int]:
    """The ids that receive outputs: 0 (the launcher) alone, or the launcher and workers 1..N."""
    return [0] if num_workers == 1 else list(range(num_workers + 1))


DETOKENIZER_MODES = ("process", "inline")
WARMUP_RID_PREFIX = "WARMUP_"      # the server's own warm-up request (server.warmup): not in the run's records


def is_warmup(rid: str) -> bool:
    return rid.startswith(WARMUP_RID_PREFIX)


def check_detokenizer(value: str) -> str:
    """`value` if it is a valid server.detokenizer, else ValueError naming the valid ones."""
    if value not in DETOKENIZER_MODES:
        raise ValueError(f"server.detokenizer={value!r}: must be one of {', '.join(DETOKENIZER_MODES)}")
    return value


def by_worker(outputs) -> dict[int, list]:
    """Outputs (anything with `worker`) grouped by the worker they go to, each group in order."""
    groups: dict[int, list] = {}
    for out in outputs:
        groups.setdefault(out.worker, []).append(out)
    return groups


@dataclass
class DetokSpec:
    """What the detokenizer needs to turn a request's token ids into text."""

    prompt_tail_ids: list[int]
    stop_strs: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    no_stop_trim: bool = False       # the matched stop string stays in the text (SGLang's no_stop_trim)


@dataclass
class TokenizedRequest:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    arrival_clock_s: float                 # time.perf_counter() when the HTTP request arrived
    detok: DetokSpec
    worker: int = 0                        # the tokenizer worker that owns it (its outputs go there)


@dataclass
class AbortReq:
    """Its client is gone: honoured only for the worker that owns `rid`."""

    rid: str
    worker: int = 0


@dataclass
class ControlReq:
    """kind: flush_cache | server_info | dump_records | abort | shutdown; the reply goes to `worker`."""

    kind: str
    req_id: int
    args: dict = field(default_factory=dict)
    worker: int = 0


@dataclass
class ControlReply:
    kind: str
    req_id: int
    ok: bool
    payload: Any = None
    worker: int = 0


@dataclass
class Finish:
    """How a request ended. reason: stop | length | abort | too_long; `matched`: the stop token id
    or stop string; token counts and the scheduler's own latencies (seconds)."""

    reason: str
    matched: Any
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_s: float | None
    ttft_s: float | None


class TokenLogprob(NamedTuple):
    """A token's log-probability under the distribution its position was sampled from (None for the
    first prompt token reported: nothing precedes it); `text` (the token alone, decoded) and `utf8`
    (its bytes) are filled in by the detokenizer."""

    logprob: Optional[float]
    token_id: int
    text: Optional[str] = None
    utf8: Optional[bytes] = None


class PositionLogprobs(NamedTuple):
    """One output position: the sampled token and the most likely ones (descending)."""

    sampled: TokenLogprob
    top: list[TokenLogprob]


class RequestOutput(NamedTuple):
    """New tokens of one request since its last output; `detok` on the first one; `logprobs`, one per
    token, when the request asked for them; `prompt_logprobs` on the first one, when asked: its prompt
    tokens from the start it asked for (SGLang's input_token_logprobs); `worker`: the tokenizer worker
    it goes to."""

    rid: str
    token_ids: list[int]
    finish: Optional[Finish] = None
    detok: Optional[DetokSpec] = None
    logprobs: Optional[list[PositionLogprobs]] = None
    prompt_logprobs: Optional[list[PositionLogprobs]] = None
    worker: int = 0


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    cache_tokens: int
    prompt_tokens_total: int               # of admitted requests
    cached_tokens_total: int


class TextOutput(NamedTuple):
    rid: str
    text: str                              # new text since the last output
    token_ids: list[int]
    finish: Optional[Finish] = None
    logprobs: Optional[list[PositionLogprobs]] = None   # one per token id, with the tokens' text
    prompt_logprobs: Optional[list[PositionLogprobs]] = None   # on the first output, when asked


def _unpack(cls, rows: list[tuple], stats: Optional[SchedulerStats], *extra):
    new = tuple.__new__
    return cls([new(cls.row_type, row) for row in rows], stats, *extra)


class _Batch:
    """One message of many requests' outputs. Pickled as plain tuples (one per request): a tenth of
    the cost of pickling the named tuples themselves, which matters with hundreds per step."""

    row_type: type = tuple

    def __init__(self, outputs: list, stats: Optional[SchedulerStats] = None) -> None:
        self.outputs, self.stats = outputs, stats

    def __reduce__(self):
        return _unpack, (type(self), [tuple(o) for o in self.outputs], self.stats)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.outputs!r}, {self.stats!r})"


class BatchOutput(_Batch):
    """Scheduler -> detokenizer: one driver iteration's RequestOutputs (new requests' first). `delivered`:
    how many of the leading (first) outputs the scheduler also sent straight to their workers
    (server.first_outputs_direct): the detokenizer decodes them, so that its text state goes on from them,
    but does not send them again."""

    row_type = RequestOutput

    def __init__(self, outputs: list, stats: Optional[SchedulerStats] = None, delivered: int = 0) -> None:
        super().__init__(outputs, stats)
        self.delivered = delivered

    def __reduce__(self):
        return _unpack, (type(self), [tuple(o) for o in self.outputs], self.stats, self.delivered)


class BatchText(_Batch):
    """Detokenizer -> HTTP process: TextOutputs."""

    row_type = TextOutput


@dataclass
class Ready:
    """The scheduler loaded the model and serves."""

    kv_capacity_tokens: int
    max_context_tokens: int
    vocab_size: int
    device: str
    pid: int


BUSY_POLL_AUTO_MIN_CORES = 8       # busy polling costs a core per receiving process: only where cores are plenty
BUSY_POLL_AUTO_S = 0.1             # longer than a step: a receiver serving requests never sleeps between steps


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_busy_poll_s(value: float | None, cpu_count: int | None = None) -> float:
    """server.busy_poll_s: how long a receiving process spins after its last message before it sleeps in
    the kernel; null = BUSY_POLL_AUTO_S where at least BUSY_POLL_AUTO_MIN_CORES cores are usable, else 0."""
    if value is None:
        cores = usable_cores() if cpu_count is None else cpu_count
        return BUSY_POLL_AUTO_S if (cores or 1) >= BUSY_POLL_AUTO_MIN_CORES else 0.0
    if value < 0:
        raise ValueError(f"server.busy_poll_s={value}: must be >= 0 (seconds; null = auto)")
    return float(value)


class WorkerPushes:
    """An Outbox to each tokenizer worker (`worker_ids`). `send_to` sends to one; `send_pyobj` routes a
    message by its `worker` (0, the launcher's, for one without: Ready), and splits a BatchOutput into one
    BatchOutput per worker, each with the scheduler's gauges: so the scheduler sends straight to the workers
    with server.detokenizer=inline, and the detokenizer process sends its replies the same way."""

    def __init__(self, addresses: Addresses, num_workers: int) -> None:
        from runtime.server.channel import Outbox

        self._pushes = {w: Outbox(addresses.worker(w)) for w in worker_ids(num_workers)}

    def send_to(self, worker: int, msg) -> None:
        self._pushes[worker].send_pyobj(msg)

    def send_pyobj(self, msg) -> None:
        if isinstance(msg, BatchOutput):
            for worker, mine in by_worker(msg.outputs).items():
                self.send_to(worker, BatchOutput(mine, msg.stats))
        else:
            self.send_to(getattr(msg, "worker", 0), msg)

    def flush(self) -> bool:
        """Write what the sockets take now; True when nothing is left."""
        return all([push.flush() for push in self._pushes.values()])

    def close(self, linger_ms: int = 1000) -> None:
        for push in self._pushes.values():
            push.close(linger_ms)
