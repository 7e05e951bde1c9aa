"""Builds a step's ForwardBatch from a core StepPlan over a device-resident request->slot table
(SGLang's ReqToTokenPool) and resolves overlap placeholders (SGLang's future token ids) on the
device. Host work per step grows with requests and new tokens, never with context lengths.

Legend: B = sequences, T = new tokens, K = KV tokens attended, R = table rows, L = table columns,
F = future-token ring. Imports torch; never imported by runtime/core or sim/.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runtime.core.batch import StepPlan
from runtime.core.request import Request
from runtime.engine.forward_batch import ForwardBatch, _check_counts, _fill_slice, _to_device


class FutureTokens:
    """A device ring of sampled tokens. A step's sampling rows get ring indices at launch; the
    scheduler carries -(index + 1) as the token until it is resolved, and the next step's input ids
    read the ring on the device, so launching step n+1 needs no sync with step n."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self.tokens = torch.zeros(size, dtype=torch.long, device=device)   # [F]
        self._next = 0

    def reserve(self, count: int) -> np.ndarray:
        """Ring indices for `count` new tokens (the ring is sized for two steps in flight)."""
        if count > self.size // 2:
            raise ValueError(f"{count} sampled tokens in one step exceed the future ring of {self.size}")
        idx = (self._next + np.arange(count)) % self.size
        self._next = (self._next + count) % self.size
        return idx

    @staticmethod
    def placeholders(idx: np.ndarray) -> list[int]:
        return (-(idx.astype(np.int64) + 1)).tolist()

    def store(self, idx: torch.Tensor, token_ids: torch.Tensor) -> None:
        self.tokens[idx] = token_ids

    def resolve(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Replace placeholders (negative ids) in input_ids [T] by the ring's tokens, on the device."""
        return torch.where(input_ids < 0, self.tokens[(-input_ids - 1).clamp_(0, self.size - 1)], input_ids)


@dataclass
class _Row:
    request: Request
    row: int
    kv_version: int
    populated: int      # table[row, :populated] holds request.kv_slots[:populated]


class ReqToTokenTable:
    """int32 [R, L]: row r holds the KV slot of every position of the request that owns it. Rows are
    written as slots are allocated (only what changed since the last step) and rewritten when the
    core reports rewritten slots (`Request.kv_version`: re-pinned on the cache's copy, retracted)."""

    def __init__(self, num_rows: int, max_context_tokens: int, device: torch.device) -> None:
        self.num_rows, self.max_context_tokens, self.device = num_rows, max_context_tokens, device
        self.table = torch.zeros(num_rows, max_context_tokens, dtype=torch.int32, device=device)   # [R, L]
        self._rows: dict[str, _Row] = {}
        self._free = list(range(num_rows - 1, -1, -1))

    @staticmethod
    def bytes_for(num_rows: int, max_context_tokens: int) -> int:
        return num_rows * max_context_tokens * 4

    def rows_for(self, plan: StepPlan) -> tuple[np.ndarray, np.ndarray]:
        """Row of every item (int32 [B]) and the (row, column, slot) writes that bring the rows up to
        date, packed as int64 [3, W]; mutates the host-side row bookkeeping."""
        rows = np.empty(len(plan.items), dtype=np.int32)
        writes: list[np.ndarray] = []
        for i, item in enumerate(plan.items):
            req = item.request
            end = item.num_prefix_tokens + item.num_new_tokens
            if end > self.max_context_tokens:
                raise ValueError(f"request {req.rid} reaches {end} tokens; the slot table holds "
                                 f"{self.max_context_tokens}")
            entry = self._rows.get(req.rid)
            if entry is not None and entry.request is not req:   # an earlier request with the same id
                self._free.append(self._rows.pop(req.rid).row)
                entry = None
            if entry is None:
                entry = self._assign(req, plan)
            if entry.kv_version != req.kv_version:
                entry.kv_version, entry.populated = req.kv_version, 0
            if entry.populated < end:
                start = item.num_prefix_tokens
                head = req.kv_slots[entry.populated:start] if entry.populated < start else []
                values = np.concatenate((np.asarray(head, dtype=np.int64), np.asarray(item.new_slots, dtype=np.int64)))
                first = min(entry.populated, start)
                cols = np.arange(first, first + len(values), dtype=np.int64)
                writes.append(np.stack([np.full(len(values), entry.row, dtype=np.int64), cols, values]))
                entry.populated = first + len(values)
            rows[i] = entry.row
        packed = np.concatenate(writes, axis=1) if writes else np.empty((3, 0), dtype=np.int64)
        return rows, packed

    def apply(self, packed_writes: torch.Tensor) -> None:
        """packed_writes int64 [3, W] on the device: table[row, col] = slot."""
        if packed_writes.shape[1]:
            self.table[packed_writes[0], packed_writes[1]] = packed_writes[2].to(torch.int32)

    def _assign(self, req: Request, plan: StepPlan) -> _Row:
        if not self._free:
            self._sweep({it.request.rid for it in plan.items})
        if not self._free:
            raise RuntimeError(f"all {self.num_rows} slot-table rows are in use")
        entry = _Row(req, self._free.pop(), -1, 0)
        self._rows[req.rid] = entry
        return entry

    def _sweep(self, in_plan: set[str]) -> None:
        """Free rows of requests that ended or went back to the queue (stream order keeps a step still
        in flight safe: a reused row is rewritten only after it ran)."""
        for rid, entry in list(self._rows.items()):
            req = entry.request
            if rid not in in_plan and (req.is_finished or len(req.kv_slots) == 0):
                del self._rows[rid]
                self._free.append(entry.row)


@dataclass
class HostBatch:
    """The host half of a step's ForwardBatch: everything `BatchBuilder.to_device` needs, in plain
    lists and arrays (picklable: the TP leader broadcasts it to the other ranks of its group)."""

    new_ids: list[list[int]]        # per sequence; negative = a future-ring placeholder
    prefix_lens: list[int]
    new_slots: list                 # per sequence, the KV slots its new tokens write
    is_decode: list[bool]
    rows: np.ndarray                # int32 [B] slot-table row of each sequence
    table_writes: np.ndarray        # int64 [3, W] (row, column, slot) updates of the slot table


class BatchBuilder:
    """StepPlan -> ForwardBatch with kv_indices gathered on the device from the slot table. `host(plan)`
    reads the plan and keeps the table's bookkeeping (the scheduling rank only); `to_device(batch)`
    applies it to this device's table and builds the tensors (every rank)."""

    def __init__(self, num_rows: int, max_context_tokens: int, device: torch.device,
                 future: FutureTokens) -> None:
        self.device = device
        self.table = ReqToTokenTable(num_rows, max_context_tokens, device)
        self.future = future
        self._use_triton = device.type == "cuda"

    def build(self, plan: StepPlan) -> ForwardBatch:
        return self.to_device(self.host(plan))

    def host(self, plan: StepPlan) -> HostBatch:
        new_ids, prefix_lens = [], []
        for item in plan.items:
            req, start, num_new = item.request, item.num_prefix_tokens, item.num_new_tokens
            ids = _fill_slice(req.input_ids, req.output_ids, start, num_new)
            if len(ids) != num_new or len(item.new_slots) != num_new:
                _check_counts(len(ids), start, start + len(item.new_slots), num_new_slots=len(item.new_slots))
            new_ids.append(ids)
            prefix_lens.append(start)
        rows, writes = self.table.rows_for(plan)
        return HostBatch(new_ids, prefix_lens, [it.new_slots for it in plan.items],
                         [it.is_decode for it in plan.items], rows, writes)

    def to_device(self, batch: HostBatch) -> ForwardBatch:
        self.table.apply(_to_device(batch.table_writes, self.device))
        rows_t = _to_device(batch.rows, self.device)
        fb = ForwardBatch._assemble(batch.new_ids, batch.prefix_lens, None, batch.new_slots, batch.is_decode,
                                    self.device,
                                    device_kv_indices=lambda indptr, k, longest: self._kv_indices(rows_t, indptr, k, longest))
        if any(ids and min(ids) < 0 for ids in batch.new_ids):
            fb.input_ids = self.future.resolve(fb.input_ids)
        return fb

    def _kv_indices(self, rows: torch.Tensor, kv_indptr: torch.Tensor, num_kv: int, longest: int) -> torch.Tensor:
        if self._use_triton:
            from kernels.kv_indices.triton_kv_indices import kv_indices_triton
            return kv_indices_triton(self.table.table, rows, kv_indptr, num_kv, longest)
        from kernels.kv_indices.triton_kv_indices import kv_indices_torch
        return kv_indices_torch(self.table.table, rows, kv_indptr, num_kv)
