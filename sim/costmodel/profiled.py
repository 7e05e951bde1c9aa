"""Profiled cost model: step times from the runtime's own measurements (`python run.py mode=profile`),
falling back to the roofline, scaled to the nearest measured point, outside the grid. Torch-free.

- decode-only steps: the graph table at the padded capture size when the runtime replays a graph
  (batch <= cuda_graph_max_bs; None = every batch), else the eager table; batch x context per request,
  KV tokens read again by several requests (shared prefixes) counted at the fraction fitted from the
  profile's decode_shared table (sim.costmodel.shared_reads).
- steps with prefill: one sequence's new tokens x cached prefix, among the columns of the MLA form the
  runtime picks for the step (runtime.core.mla_form). Several sequences are priced at the prefix that
  gives one sequence the same attention pairs (in MHA form plus the expansion of every sequence's
  prefix, at a rate fitted on the multi-sequence points), times a correction measured on those points.
  A mixed step is priced like that with its decodes as one-token extends (as the runtime runs them).
- host time (what overlap hides): schedule + commit of the real Scheduler, from the host table.
  Kernel launches are inside the measured device time (a step launched while the previous one runs);
  the launch's own host time (host table, sim.costmodel.profile_launch) says when the host is free to
  plan the next step.
"""
from __future__ import annotations

import bisect
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.mla_form import mla_attends_as_mha
from runtime.core.model_spec import ModelSpec
from sim.costmodel.base import CostModel, StepShape, decode_segments_one_by_one
from sim.costmodel.mla_kv_split import KVSplitExcess, num_clusters
from sim.costmodel.profile_after_decode import AfterDecode
from sim.costmodel.profile_host import HostTable
from sim.costmodel.profile_idle import IdleLaunch
from sim.costmodel.profile_launch import LaunchTable
from sim.costmodel.shared_reads import fit_shared_read_fraction
from sim.costmodel.profile_tables import (
    Curve, DecodeTable, PrefillColumns, capture_batch_sizes, lerp_rows, prefill_piecewise_limit,
)
from sim.costmodel.profile_layouts import profile_for_layout

FORMS = ("mha", "absorbed")


DECODE_KV_SPLITS = ("flashinfer_mla", "none")
PADDING_ROWS = ("alike", "as_real")


def decode_kv_split_model(kind: str, model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                          graph_rows: pd.DataFrame) -> "KVSplitExcess | None":
    """The decode steps' attention split (`decode_kv_split`): FlashInfer's MLA plan for MLA models on a GPU
    whose SMs are known, fitted to the profile's graph-replayed decode rows; None otherwise ('none')."""
    if kind not in DECODE_KV_SPLITS:
        raise ValueError(f"decode_kv_split={kind!r}: expected one of {', '.join(DECODE_KV_SPLITS)}")
    if kind == "none" or not model.is_mla or hardware.num_sms <= 0:
        return None
    heads = model.num_attention_heads // max(layout.tp, 1)            # per rank: the plan's packed query rows
    return KVSplitExcess.fit(graph_rows, num_clusters(hardware.num_sms, heads))


def equivalent_prefix(tokens: float, pairs: float) -> float:
    """The cached prefix one sequence of `tokens` new tokens attends over to make `pairs` attention pairs."""
    return pairs / tokens - (tokens + 1) / 2


class ProfiledCostModel:
    """`fallback(model=, hardware=, layout=, cuda_graph_max_bs=, piecewise_max_tokens=)` builds the roofline used outside the
    grid. `fallbacks` counts priced steps per kind that fell outside the grid; `num_priced` all of them."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                 fallback: Callable[..., CostModel], profile: str = "auto", cuda_graph: bool = True,
                 cuda_graph_max_bs: int | None = None, default_graph_max_bs: int = 1024,
                 piecewise_max_tokens: int | None = None, decode_kv_split: str = "none",
                 padding_rows: str = "alike") -> None:
        if padding_rows not in PADDING_ROWS:
            raise ValueError(f"padding_rows={padding_rows!r}: expected one of {', '.join(PADDING_ROWS)}")
        # the profile of this layout's replicas (tp/ep); pp, DP attention and unprofiled layouts refused
        directory = profile_for_layout(hardware.name, model.name, layout, profile)
        self.directory, self.model = directory, model
        self.tp = layout.tp       # ranks that launch every step in lockstep (launch_ends_step)
        # the profile measured extend steps as the runtime ran them (piecewise graphs where it had them);
        # the roofline prices the steps outside its grid the same way
        self.roofline = fallback(model=model, hardware=hardware, layout=layout, cuda_graph_max_bs=cuda_graph_max_bs,
                                 piecewise_max_tokens=piecewise_max_tokens)
        decode = pd.read_csv(directory / "decode.csv")
        self.graph = DecodeTable(decode[decode["path"] == "graph"]) if cuda_graph else DecodeTable(decode.iloc[:0])
        self.eager = DecodeTable(decode[decode["path"] == "eager"])
        self.kv_split = decode_kv_split_model(decode_kv_split, model, hardware, layout, decode[decode["path"] == "graph"])
        limit = cuda_graph_max_bs if cuda_graph_max_bs is not None else default_graph_max_bs
        self.graph_max_bs = limit if (cuda_graph and self.graph) else 0
        self.capture_sizes = capture_batch_sizes(limit) if self.graph_max_bs else []
        # a graph replay's padding rows all carry one token (the runtime zero-fills them), so they route to one
        # expert set, where the table measured every row a distinct token (padding_saving_s)
        self.padding_rows_alike = padding_rows == "alike"
        self._padding_cache: dict[tuple[int, int], float] = {}
        self._row_cost_s: float | None = None
        prefill = pd.read_csv(directory / "prefill.csv")
        # the two launch regimes (piecewise graphs, eager) as the profile measured them and as the runtime runs
        regimes = dict(split_tokens=prefill_piecewise_limit(directory), query_limit=piecewise_max_tokens)
        single = prefill[prefill["num_seqs"] == 1]
        self.single = PrefillColumns(single, **regimes)
        # launch-bound time of one-sequence steps: back to back minus with the launch hidden (tables measured
        # before `device_alone_s` existed have none: priced as launched back to back)
        self.launch_back_to_back = _back_to_back_launch(single, regimes["split_tokens"])
        self.launch_bound = (PrefillColumns(_launch_bound_rows(single), **regimes)
                             if "device_alone_s" in prefill and prefill["device_alone_s"].notna().any() else None)
        self.columns = self._form_columns()
        self.expand_s_per_token = self._expand_rate(prefill[prefill["num_seqs"] > 1])
        self._multi = self._multi_factors(prefill[prefill["num_seqs"] > 1])
        host_rows = pd.read_csv(directory / "host.csv") if (directory / "host.csv").exists() else None
        self.host = HostTable(host_rows) if host_rows is not None else None
        idle = directory / "idle_launch.csv"
        self.idle_launch = IdleLaunch(pd.read_csv(idle)) if idle.exists() else None
        after_decode = directory / "prefill_after_decode.csv"
        self.after_decode = AfterDecode(pd.read_csv(after_decode)) if after_decode.exists() else None
        self.launch = (LaunchTable(host_rows, piecewise_max_tokens)
                       if host_rows is not None and "launch_s" in host_rows else None)
        shared = directory / "decode_shared.csv"
        self.shared_fit = (fit_shared_read_fraction(pd.read_csv(shared), {"graph": self.graph, "eager": self.eager})
                           if shared.exists() else None)
        # of the KV tokens a decode step reads again (shared prefixes), the share priced as private reads;
        # without a decode_shared table, all of them (no reuse in the GPU's caches assumed)
        self.shared_read_fraction = self.shared_fit.fraction if self.shared_fit is not None else 1.0
        self.fallbacks = {"decode": 0, "prefill": 0}
        self.num_priced = 0
        self._prefill_cache: dict = {}
        self._terms_cache: dict = {}      # step key -> _extend_terms (priced once, asked again by launch_bound_s)
        self._log2_cache: dict[int, float] = {}
        self._edge_roofline_cache: dict[tuple[int, int], float] = {}   # the roofline at a grid edge (fallbacks)
        self._host_cache: dict[tuple[int, int, int], float] = {}
        self._launch_cache: dict[tuple[int, int, int], float] = {}
        self._bound_cache: dict = {}
        self._decode_host_cache: dict[int, float] = {}

    # -- CostModel ----------------------------------------------------------------------
    def step_time_s(self, shape: StepShape) -> float:
        return self.device_time_s(shape) + self.host_time_s(shape)

    def host_time_s(self, shape: StepShape) -> float:
        if self.host is None:
            return self.roofline.host_time_s(shape)
        key = (len(shape.extend_new_tokens), sum(shape.extend_new_tokens), shape.num_decode_reqs)
        cached = self._host_cache.get(key)        # few distinct keys: decode batch sizes, full chunks
        if cached is None:
            cached = self._host_cache[key] = self.host.host_s(*key)
        return cached

    def launch_time_s(self, shape: StepShape) -> float:
        """The host table's launch (timed on an idle device, each step after the one before had ended); for
        piecewise extends under tensor parallelism, the prefill table's launch of one sequence of as many tokens
        without a cached prefix, timed back to back (launch_host_s): served, the ranks launch such steps in
        lockstep behind the step ahead, as they do back to back, and the leader's launch waits on the other ranks
        as it does there. Served tp=2 launches of up to 2,048 tokens took 14-17 ms (medians) on a machine whose
        back-to-back launches took 13-15 ms and idle ones 10.5-12 ms (experiments/results/h200x2/
        fidelity_tp2_limit8192), and 10-14 ms on one with 11-12 ms back to back and 13.7-14.5 ms idle
        (experiments/results/h200x2/launch_times). Without NCCL's graph mixing support (real.nccl_graph_mixing,
        off by default), whose fences had held the attention cores at the device's pace, they still do: served
        extends of up to 2,048 tokens launched in 15-18 ms (medians) where the table's back-to-back launches
        took 12.5-17 ms and idle ones 8.6-10 ms (experiments/results/h200x2/fidelity_tp2_no_graph_mixing)."""
        if self.launch is None:
            return self.roofline.launch_time_s(shape)
        key = (len(shape.extend_new_tokens), sum(shape.extend_new_tokens), shape.num_decode_reqs)
        cached = self._launch_cache.get(key)
        if cached is None:
            if self.launch_back_to_back is not None and self._lockstep_piecewise(shape):
                cached = float(self.launch_back_to_back(key[1] + key[2]))
            else:
                cached = self.launch.launch_s(*key)
            self._launch_cache[key] = cached
        return cached

    def idle_launch_factor(self, idle_s: float) -> float:
        """The idle_launch table's factor after `idle_s` seconds of host idle (sim/costmodel/profile_idle.py);
        1 where the profile has no such table."""
        return self.idle_launch.factor(idle_s) if self.idle_launch is not None else 1.0

    def _lockstep_piecewise(self, shape: StepShape) -> bool:
        """A step with extends replayed as piecewise graphs by ranks that launch in lockstep (tp > 1)."""
        return (self.tp > 1 and bool(shape.extend_new_tokens)
                and not self.single.runs_eagerly(sum(shape.extend_new_tokens) + shape.num_decode_reqs))

    def device_waits_for_launch(self, shape: StepShape) -> bool:
        """Decode-only steps that replay a captured graph (the batch within the graph limit)."""
        return shape.is_decode_only and shape.num_decode_reqs <= self.graph_max_bs

    def launch_ends_step(self, shape: StepShape) -> bool:
        """Steps with extends that replay piecewise graphs (up to the piecewise limit) under tensor parallelism
        (tp > 1), where the profile has the launch table and device_alone_s. The leader hands such a step to
        the other ranks, which take it once they have launched the step ahead, and each enqueues the graph
        pieces with the attention cores between them without waiting on the device: back to back (the profile's
        interval) every rank waits on the others, so the whole excess over the kernels alone (launch_bound_s)
        is that lockstep, hidden only by what the step ahead still runs once every rank could take this one;
        the step ends no earlier than its launch after that, and its ranks are done launching it only as it
        ends (sim/driver.py). At tp=2 such steps take 12-20 ms back to back against 6-19 ms alone. Eager
        steps' launches wait on the device (host syncs), and at tp=1 a launch returns well before its step
        ends: both keep the capped head-start rule. Decode-only steps: False."""
        return self._launch_terms(shape)[1]

    def launch_bound_s(self, shape: StepShape) -> float:
        """Steps with extends: the one-sequence table's back-to-back interval minus its device time alone
        at the step's (tokens, equivalent prefix), at most the step's price. Where launch_ends_step, all of it
        (the driver ends the step at the later of its kernels alone and its launch on every rank); else at most
        what the step's launch (launch_time_s, timed with the device idle) outlasts its device time alone: a
        step whose kernels outlast its launch is device-bound, and the rest of its back-to-back excess is the
        launch waiting on the device (eager steps' host syncs: 8k-token prefills at tp=1 take 34 ms to launch
        on an idle device, 92 ms back to back), which no head start removes. Decode-only steps: 0 (their
        graph launches are shorter than their kernels)."""
        return self._launch_terms(shape)[0]

    def after_decode_saving_s(self, shape: StepShape) -> float:
        """Extends replayed as piecewise graphs whose kernels outlast their launch (device-bound), not in lockstep:
        their back-to-back excess over their kernels alone (the one-sequence table's device_s - device_alone_s
        at the step's tokens and equivalent prefix), which a step served right behind a decode does not pay:
        all of it, or the share the prefill_after_decode table measured at the step's new tokens
        (sim/costmodel/profile_after_decode.py; on an H200, 0.75-1.00 of it at 1,024-8,192 tokens). 0 for every
        other step, and where the profile has no device_alone_s."""
        return self._launch_terms(shape)[2]

    def _launch_terms(self, shape: StepShape) -> tuple[float, bool, float]:
        """(launch_bound_s, launch_ends_step, after_decode_saving_s) of a step, remembered per step key."""
        if self.launch_bound is None or shape.is_decode_only or not (shape.extend_new_tokens or shape.num_decode_reqs):
            return 0.0, False, 0.0
        key = (shape.extend_new_tokens, shape.extend_prefix_tokens, shape.num_decode_reqs, shape.decode_context_tokens)
        cached = self._bound_cache.get(key)
        if cached is None:
            tokens, pairs, _, form, _ = self._terms(key, shape)
            bound, _ = self.launch_bound.lookup(tokens, equivalent_prefix(tokens, pairs), self.columns[form])
            price = self._prefill_cache.get(key)             # the step's price, without counting it again
            if price is None:
                price = self._prefill_cache[key] = self._prefill_s(shape)
            bound = min(max(bound, 0.0), price[0])
            alone = price[0] - bound
            ends = self.launch is not None and self._lockstep_piecewise(shape)
            saving = 0.0
            if not ends:                                    # the part of the excess a head start can hide
                launch = self.launch_time_s(shape)
                if launch <= alone and not self.single.runs_eagerly(tokens):
                    # device-bound graph replay (see after_decode_saving_s): the share of the excess that the
                    # profile's prefill_after_decode table shows a step right behind a decode run not paying
                    share = self.after_decode.saved_share(tokens) if self.after_decode is not None else 1.0
                    saving = bound * share
                bound = min(bound, max(launch - alone, 0.0))
            cached = self._bound_cache[key] = (bound, ends, saving)
        return cached

    def decode_times_s(self, num_reqs: int, context_tokens: np.ndarray, shared_tokens: int = 0,
                       first_context_lens: np.ndarray | None = None) -> np.ndarray:
        host = self._decode_host_cache.get(num_reqs)     # independent of the context: one per batch size
        if host is None:
            host = self._decode_host_cache[num_reqs] = self.host_time_s(
                StepShape(num_decode_reqs=num_reqs, decode_context_tokens=num_reqs))
        return self._decode_s(num_reqs, np.asarray(context_tokens, dtype=np.float64), shared_tokens,
                              first_context_lens) + host

    def decode_segment_times_s(self, num_reqs: Sequence[int], segment_steps: Sequence[int],
                               context_tokens: np.ndarray, shared_tokens: Sequence[int],
                               first_context_lens: Sequence[np.ndarray | None]) -> np.ndarray:
        """decode_times_s of every segment in one pass: the same arithmetic elementwise (so the same
        floats), with one table lookup per distinct (path, padded batch) rather than per segment."""
        if self.kv_split is not None:
            return decode_segments_one_by_one(self, num_reqs, segment_steps, context_tokens, shared_tokens,
                                              first_context_lens)
        counts = np.asarray(segment_steps, dtype=np.int64)                                  # [g]
        context = np.asarray(context_tokens, dtype=np.float64)                              # [k]
        self.num_priced += len(context)
        if any(shared_tokens):   # as _decode_s: a segment with shared tokens is priced at a shorter context
            shared = np.repeat(np.asarray(shared_tokens, dtype=np.int64), counts)            # [k]
            context = np.where(shared != 0, context - (1.0 - self.shared_read_fraction) * shared, context)
        keys, pads, hosts, savings = [], [], [], []
        for n in num_reqs:
            table, batch = self.eager, n
            if 0 < n <= self.graph_max_bs:
                table = self.graph
                i = bisect.bisect_left(self.capture_sizes, n)
                batch = self.capture_sizes[i] if i < len(self.capture_sizes) else n
            keys.append((table is self.graph, batch))
            pads.append(batch - n)
            savings.append(self.padding_saving_s(batch, n) if table is self.graph and batch > n else 0.0)
            host = self._decode_host_cache.get(n)
            if host is None:
                host = self._decode_host_cache[n] = self.host_time_s(StepShape(num_decode_reqs=n, decode_context_tokens=n))
            hosts.append(host)
        if any(pads):                                         # padding rows attend one token each
            context = context + np.repeat(np.asarray(pads, dtype=np.int64), counts)
        distinct = set(keys)
        if len(distinct) == 1:
            graph, batch = keys[0]
            times, inside = (self.graph if graph else self.eager).lookup(batch, context)
            step_keys = None
        else:
            times, inside = np.empty(len(context)), np.empty(len(context), dtype=bool)
            step_keys = np.repeat(np.array([keys.index(key) for key in keys]), counts)   # [k] first segment of the key
            for key in distinct:
                rows = step_keys == keys.index(key)
                graph, batch = key
                times[rows], inside[rows] = (self.graph if graph else self.eager).lookup(batch, context[rows])
        if not inside.all():
            outside = np.flatnonzero(~inside)
            self.fallbacks["decode"] += len(outside)
            for j in outside:
                graph, batch = keys[0] if step_keys is None else keys[int(step_keys[j])]
                times[j] = self._decode_fallback(self.graph if graph else self.eager, batch, float(context[j]))
        if any(savings):                                      # as _decode_s: the padding rows' saving
            times = times - np.repeat(np.asarray(savings, dtype=np.float64), counts)
        return times + np.repeat(np.asarray(hosts, dtype=np.float64), counts)

    def breakdown_s(self, shape: StepShape) -> dict[str, float]:
        return {"device": self.device_time_s(shape), "host": self.host_time_s(shape)}

    def summary(self) -> dict:
        """For the run summary: where the profile came from and how often the grid was left."""
        return {"name": "profiled", "profile": str(self.directory), "num_priced_steps": self.num_priced,
                "shared_read_fraction": self.shared_read_fraction,
                "fallback_steps": dict(self.fallbacks),
                "fallback_share": sum(self.fallbacks.values()) / self.num_priced if self.num_priced else 0.0}

    # -- device time --------------------------------------------------------------------
    def device_time_s(self, shape: StepShape) -> float:
        if shape.is_decode_only:
            lens = np.array(shape.decode_context_lens, dtype=np.int64) if shape.decode_context_lens else None
            return float(self._decode_s(shape.num_decode_reqs, np.array([float(shape.decode_context_tokens)]),
                                        shape.decode_shared_tokens, lens)[0])
        if not shape.extend_new_tokens and not shape.num_decode_reqs:
            return 0.0
        key = (shape.extend_new_tokens, shape.extend_prefix_tokens, shape.num_decode_reqs, shape.decode_context_tokens)
        cached = self._prefill_cache.get(key)
        if cached is None:
            cached = self._prefill_cache[key] = self._prefill_s(shape)
        self.num_priced += 1
        if not cached[1]:
            self.fallbacks["prefill"] += 1
        return cached[0]

    def _decode_s(self, num_reqs: int, context: np.ndarray, shared: int = 0,
                  first_lens: np.ndarray | None = None) -> np.ndarray:
        """Times [k] of k consecutive decode steps whose KV lengths sum to context[j]: the table at the
        padded batch (equal contexts of the sum), plus where the requests' own lengths are known
        (`first_lens`, step 0; one more each step) how much longer or shorter the attention's split of
        their work over the GPU runs than that of equal ones."""
        self.num_priced += len(context)
        if shared:           # priced as the context of private KV that costs the same
            context = context - (1.0 - self.shared_read_fraction) * shared
        table, batch = self.eager, num_reqs
        if 0 < num_reqs <= self.graph_max_bs:
            table = self.graph
            i = bisect.bisect_left(self.capture_sizes, num_reqs)
            batch = self.capture_sizes[i] if i < len(self.capture_sizes) else num_reqs
            context = context + (batch - num_reqs)             # padding rows attend one token each
        times, inside = table.lookup(batch, context)
        if not inside.all():
            self.fallbacks["decode"] += int((~inside).sum())
            for j in np.flatnonzero(~inside):
                times[j] = self._decode_fallback(table, batch, float(context[j]))
        if table is self.graph and batch > num_reqs:
            times = times - self.padding_saving_s(batch, num_reqs)
        if self.kv_split is not None and first_lens is not None:
            times = times + self.kv_split.excess_s(first_lens, batch, len(times))
        return times

    def padding_saving_s(self, batch: int, num_reqs: int) -> float:
        """What a graph replay of `batch` rows, `num_reqs` of them real, costs less than the table's `batch`
        distinct rows. Its padding rows carry one token (the runtime zero-fills them), which every one of them
        routes alike: together they activate one token's experts, where the table's rows each activated their
        own. A MoE step at the table's shortest context is taken as a part that follows the experts its rows
        activate plus `_row_s` a row (`_expert_part_s`); the saving is the expert part of `batch` distinct rows
        less that of `num_reqs + 1`, never below 0. 0 for dense models (padding rows cost what real rows do)
        and with `padding_rows=as_real` (priced as the table's row)."""
        if not self.padding_rows_alike or not self.model.is_moe or num_reqs + 1 >= batch:
            return 0.0
        key = (batch, num_reqs)
        saving = self._padding_cache.get(key)
        if saving is None:
            saving = self._expert_part_s(batch) - self._expert_part_s(num_reqs + 1)
            saving = self._padding_cache[key] = max(saving, 0.0) if np.isfinite(saving) else 0.0
        return saving

    def _active_experts(self, rows: float) -> float:
        """Experts `rows` distinct tokens are expected to activate, routed uniformly: E (1 - (1 - k/E)^rows)."""
        experts, per_token = self.model.num_experts, self.model.num_experts_per_tok
        return experts * (1.0 - (1.0 - per_token / experts) ** rows)

    def _row_s(self) -> float:
        """Cost of one more row once every expert is active: the graph table's least-squares slope over its
        batch sizes whose rows activate 99% of the experts or more, at its shortest context."""
        if self._row_cost_s is None:
            full = [b for b in self.graph.batches if self._active_experts(b) >= 0.99 * self.model.num_experts]
            times = [self._shortest_context_s(b) for b in full]
            self._row_cost_s = max(float(np.polyfit(full, times, 1)[0]), 0.0) if len(full) >= 2 else 0.0
        return self._row_cost_s

    def _shortest_context_s(self, rows: int) -> float:
        """The graph table's step of `rows` requests at its shortest context per request."""
        per_row = self.graph.min_context_per_request()
        return float(self.graph.lookup(rows, np.array([per_row * rows]))[0][0])

    def _expert_part_s(self, rows: int) -> float:
        """A graph replay of `rows` distinct rows at the table's shortest context less `_row_s` per row: the part
        that follows the experts they activate; between measured batch sizes linear in those experts (concave
        in rows: 8 -> 12 rows add fewer experts than 4 -> 8)."""
        part = lambda b: self._shortest_context_s(b) - self._row_s() * b   # noqa: E731
        batches = self.graph.batches
        i = bisect.bisect_left(batches, rows)
        if i == 0 or i == len(batches) or batches[i] == rows:
            return part(rows)
        lo, hi = batches[i - 1], batches[i]
        span = self._active_experts(hi) - self._active_experts(lo)
        if span <= 1e-9 * self.model.num_experts:           # every expert active at both: linear in rows
            w = (rows - lo) / (hi - lo)
        else:
            w = (self._active_experts(rows) - self._active_experts(lo)) / span
        return part(lo) + w * (part(hi) - part(lo))

    def _decode_fallback(self, table: DecodeTable, batch: int, context: float) -> float:
        """The roofline's decode time, scaled by measured / roofline at the nearest grid point."""
        shape = StepShape(num_decode_reqs=batch, decode_context_tokens=int(max(context, batch)))
        if not table:
            return self._roofline_device_s(shape)
        edge_batch, edge_context = table.edge(batch, context)
        measured = float(table.lookup(edge_batch, np.array([edge_context]))[0][0])
        edge = StepShape(num_decode_reqs=edge_batch, decode_context_tokens=int(max(edge_context, edge_batch)))
        return self._roofline_device_s(shape) * measured / self._roofline_device_s(edge)

    def _roofline_device_s(self, shape: StepShape) -> float:
        return self.roofline.step_time_s(shape) - self.roofline.host_time_s(shape)

    # -- prefill and mixed steps ----------------------------------------------------------
    def _extend_terms(self, shape: StepShape) -> tuple[int, float, float, str, int]:
        """(new tokens, attention pairs, summed cached prefix, MLA form, sequences) of a step with extends,
        its decodes counted as one-token extends."""
        news = list(shape.extend_new_tokens) + [1] * shape.num_decode_reqs
        decode_prefix = shape.decode_context_tokens - shape.num_decode_reqs    # their KV before the step
        prefixes = list(shape.extend_prefix_tokens)
        pairs = sum(n * (n + 1) / 2 + n * p for n, p in zip(shape.extend_new_tokens, prefixes))
        pairs += shape.num_decode_reqs + decode_prefix
        seq_lens = [n + p for n, p in zip(shape.extend_new_tokens, prefixes)]
        seq_lens.append(shape.decode_context_tokens)
        form = self._form(prefixes + [decode_prefix] * bool(shape.num_decode_reqs), seq_lens)
        return sum(news), pairs, sum(prefixes) + decode_prefix, form, len(news)

    def _terms(self, key: tuple, shape: StepShape) -> tuple[int, float, float, str, int]:
        """_extend_terms(shape), remembered under the step's key."""
        terms = self._terms_cache.get(key)
        if terms is None:
            terms = self._terms_cache[key] = self._extend_terms(shape)
        return terms

    def _prefill_s(self, shape: StepShape) -> tuple[float, bool]:
        """(seconds, inside the grid) of a step with extends (and decodes as one-token extends)."""
        key = (shape.extend_new_tokens, shape.extend_prefix_tokens, shape.num_decode_reqs, shape.decode_context_tokens)
        tokens, pairs, sum_prefix, form, num_seqs = self._terms(key, shape)
        seconds, inside = self._base_prefill_s(tokens, pairs, sum_prefix, form)
        if num_seqs > 1:
            seconds *= self._multi_factor(form, num_seqs, tokens, sum_prefix / num_seqs)
        if self.launch is not None and self.single.runs_eagerly(tokens):
            # an eager step's kernels cannot all run before they are launched: back to back, a step whose
            # launch outlasts its device work takes its launch (host launches of eager steps differ by up
            # to 2x between lent H200s, while their device work does not)
            seconds = max(seconds, self.launch_time_s(shape))
        if inside:
            return seconds, True
        return self._prefill_fallback(shape, tokens, equivalent_prefix(tokens, pairs), form), False

    def _base_prefill_s(self, tokens: int, pairs: float, sum_prefix: float, form: str) -> tuple[float, bool]:
        """One sequence with the step's attention pairs (its equivalent prefix p_eq); in MHA form plus
        the expansion of the summed prefix beyond p_eq (kv_b_proj over every cached token, each layer)."""
        p_eq = equivalent_prefix(tokens, pairs)
        seconds, inside = self.single.lookup(tokens, p_eq, self.columns[form])
        if form == "mha" and self.model.is_mla:
            seconds += self.expand_s_per_token * max(sum_prefix - max(p_eq, 0.0), 0.0)
        return seconds, inside

    def _expand_rate(self, multi: pd.DataFrame) -> float:
        """Seconds per cached token a MHA-form step spends expanding prefix tokens beyond those its
        single-sequence price holds (kv_b_proj over every cached token of every sequence, each layer).
        Fitted where that expansion is large: the multi-sequence MHA-form points with a cached prefix
        (measured - single-sequence price at the same attention pairs, against the extra prefix tokens;
        least squares through 0). Without such points, the slope along the prefix of the fewest-new-tokens
        single-sequence row up to the largest MHA column (one sequence's expansion: small GEMMs plus
        the attention over the prefix, so an upper bound). 0 without MLA."""
        if not self.model.is_mla:
            return 0.0
        extra, residual = [], []
        for row in multi.itertuples(index=False):
            _, pairs, sum_prefix, form = self._equal_sequences(row)
            if row.prefix_tokens <= 0 or form != "mha":
                continue
            p_eq = equivalent_prefix(row.new_tokens, pairs)
            single, _ = self.single.lookup(row.new_tokens, p_eq, self.columns["mha"])
            extra.append(sum_prefix - max(p_eq, 0.0))
            residual.append(row.device_s - single)
        if extra:
            x, y = np.asarray(extra), np.asarray(residual)
            return max(float(x @ y / (x @ x)), 0.0)
        cols = [p for p in self.columns["mha"] if p > 0]
        if not cols or 0 not in self.single.curves:
            return 0.0
        tokens = float(self.single.curves[0].xs[0])
        rise = float(self.single.curves[cols[-1]](tokens) - self.single.curves[0](tokens))
        return max(rise, 0.0) / cols[-1]

    def _prefill_fallback(self, shape: StepShape, tokens: int, p_eq: float, form: str) -> float:
        cols = self.columns[form]
        edge_tokens = int(self.single.edge_tokens(tokens))
        edge_prefix = int(min(max(p_eq, 0), cols[-1]))
        measured, _ = self.single.lookup(edge_tokens, edge_prefix, cols)
        edge = self._edge_roofline_cache.get((edge_tokens, edge_prefix))
        if edge is None:
            edge = self._edge_roofline_cache[edge_tokens, edge_prefix] = self._roofline_device_s(
                StepShape((edge_tokens,), (edge_prefix,)))
        return self._roofline_device_s(shape) * measured / edge

    def _form(self, prefixes: list[int], seq_lens: list[int]) -> str:
        if not self.model.is_mla:
            return "mha"
        return "mha" if mla_attends_as_mha(prefixes, seq_lens) else "absorbed"

    def _form_columns(self) -> dict[str, list[int]]:
        """Measured prefix columns per MLA form (a model without MLA has one form: every column)."""
        by_form = {form: [] for form in FORMS}
        for p in self.single.prefixes:
            tokens = max(self.single.curves[p].max_x, self.single.eager_curves[p].max_x)   # the column's last point
            by_form[self._form([p], [int(p + tokens)])].append(p)
        everything = list(self.single.prefixes)
        return {form: cols or everything for form, cols in by_form.items()}

    # -- several sequences per step ---------------------------------------------------------
    def _equal_sequences(self, row) -> tuple[int, float, int, str]:
        """(sequences, attention pairs, summed prefix, MLA form) of a profiled step of num_seqs equal
        sequences (a prefill.csv row: new_tokens split evenly, each after prefix_tokens cached)."""
        seqs, each, prefix = int(row.num_seqs), row.new_tokens // row.num_seqs, row.prefix_tokens
        pairs = seqs * (each * (each + 1) / 2 + each * prefix)
        return seqs, pairs, seqs * prefix, self._form([prefix] * seqs, [each + prefix] * seqs)

    def _multi_factors(self, rows: pd.DataFrame) -> dict[str, list[tuple[int, "_FactorGrid"]]]:
        """Per MLA form and measured sequence count: measured / single-sequence prediction at each
        multi-sequence point of that form (forms differ in what several sequences save or cost)."""
        points: dict[tuple[str, int], list] = {}
        for row in rows.itertuples(index=False):
            seqs, pairs, sum_prefix, form = self._equal_sequences(row)
            single, _ = self._base_prefill_s(row.new_tokens, pairs, sum_prefix, form)
            points.setdefault((form, seqs), []).append((row.new_tokens, row.prefix_tokens, row.device_s / single))
        levels: dict[str, list] = {form: [] for form in FORMS}
        for (form, seqs), factors in sorted(points.items(), key=lambda kv: kv[0][1]):
            levels[form].append((seqs, _FactorGrid(pd.DataFrame(factors, columns=["tokens", "prefix", "factor"]))))
        return levels

    def _multi_factor(self, form: str, num_seqs: int, tokens: float, prefix: float) -> float:
        """Correction at (sequences, tokens, mean prefix) from the points of the step's form: bilinear
        within each measured sequence count (clamped to its box), linear in log2(sequences) between
        counts, 1 at one sequence."""
        levels = self._multi[form]
        log2 = self._log2
        keys = [0.0] + [log2(s) for s, _ in levels]
        values = [1.0] + [grid(tokens, prefix) for _, grid in levels]
        return float(lerp_rows(keys, min(log2(num_seqs), keys[-1]), values.__getitem__))

    def _log2(self, num_seqs: int) -> float:
        """float(np.log2(num_seqs)), remembered per count (a numpy scalar call costs more than the rest)."""
        value = self._log2_cache.get(num_seqs)
        if value is None:
            value = self._log2_cache[num_seqs] = float(np.log2(num_seqs))
        return value


class _FactorGrid:
    """factor(tokens, prefix) over one sequence count's measured points, clamped to their box."""

    def __init__(self, level: pd.DataFrame) -> None:
        self.prefixes = sorted(float(p) for p in level["prefix"].unique())
        self.curves = [Curve(g["tokens"], g["factor"]) for _, g in sorted(level.groupby("prefix"), key=lambda kv: kv[0])]
        self.max_tokens = max(c.max_x for c in self.curves)

    def __call__(self, tokens: float, prefix: float) -> float:
        t = min(tokens, self.max_tokens)
        p = min(max(prefix, self.prefixes[0]), self.prefixes[-1])
        return float(lerp_rows(self.prefixes, p, lambda i: self.curves[i].at(t)))


def _launch_bound_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """rows with device_s replaced by its launch-bound part: back to back minus alone, >= 0 (0 where a row
    has no device_alone_s), and device_alone_s by 0 (none of that part is device work)."""
    alone = rows["device_alone_s"].fillna(rows["device_s"])
    return rows.assign(device_s=(rows["device_s"] - alone).clip(lower=0.0), device_alone_s=rows["device_alone_s"] * 0.0)


def _back_to_back_launch(single: pd.DataFrame, piecewise_limit: int | None) -> Curve | None:
    """The launch's host time of one-sequence extends without a cached prefix, launched back to back
    (prefill.csv's launch_host_s), over new tokens up to the piecewise limit; None without such rows."""
    if "launch_host_s" not in single or not piecewise_limit:
        return None
    rows = single[(single["prefix_tokens"] == 0) & (single["new_tokens"] <= piecewise_limit)
                  & single["launch_host_s"].notna()].sort_values("new_tokens")
    if rows.empty:
        return None
    return Curve(rows["new_tokens"].to_numpy(dtype=float), rows["launch_host_s"].to_numpy(dtype=float))
