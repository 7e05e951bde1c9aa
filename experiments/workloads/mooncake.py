"""Mooncake (FAST'25) traces: real arrivals and lengths, prompts synthesised from the
512-token prefix-block hashes so that requests sharing hash ids share tokens."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.workloads.base import check_common_args, clamp_output_len, rid_width, sorted_specs
from experiments.workloads.block_tokens import BlockTokenSynthesizer
from experiments.workloads.paths import resolve_trace_path
from experiments.workloads.trace_io import int_field, int_list_field, number_field, read_jsonl, trace_error
from runtime.core.request import RequestSpec


@dataclass(frozen=True)
class MooncakeRow:
    timestamp_ms: float
    input_len_tokens: int
    output_len_tokens: int
    hash_ids: list[int]


def read_mooncake_rows(path: Path, block_size_tokens: int) -> list[MooncakeRow]:
    """All rows of a Mooncake JSONL trace, validated: ValueError names file and line on bad
    JSON, a missing/mistyped field, input_length < 1, a negative output_length, or
    len(hash_ids) != ceil(input_length / block_size)."""
    rows = []
    for line_no, row in read_jsonl(path):
        input_len = int_field(row, "input_length", path, line_no, min_value=1)
        hash_ids = int_list_field(row, "hash_ids", path, line_no)
        num_blocks = math.ceil(input_len / block_size_tokens)
        if len(hash_ids) != num_blocks:
            raise trace_error(path, line_no, f"input_length {input_len} needs ceil({input_len}/{block_size_tokens}) = "
                                             f"{num_blocks} hash_ids, got {len(hash_ids)}")
        rows.append(MooncakeRow(
            timestamp_ms=number_field(row, "timestamp", path, line_no),
            input_len_tokens=input_len,
            output_len_tokens=int_field(row, "output_length", path, line_no, min_value=0),
            hash_ids=hash_ids,
        ))
    return rows


class MooncakeWorkload:
    """One request per trace line (rid "mooncake-<0-based row>"), arriving at timestamp/1000
    * time_scale seconds. num_requests (None = all) keeps the first rows in arrival order.

    Block i of a prompt holds the tokens of hash_ids[i] (see BlockTokenSynthesizer: a pure
    function of hash id, seed, vocab_size and the file's largest hash id); the last block is cut to
    input_length - block_size * (n - 1). So two requests whose first k hash ids agree share
    exactly their first block_size * k tokens (plus, by chance, ~1/vocab_size more).
    output_length 0 becomes 1 (see clamp_output_len). A relative path is taken from the
    repository root.
    """

    def __init__(self, *, vocab_size: int, path: str = "../shared/data/mooncake/conversation_trace.jsonl",
                 block_size: int = 512, num_requests: int | None = None, time_scale: float = 1.0,
                 seed: int = 0) -> None:
        check_common_args(num_requests, time_scale, vocab_size)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.path = resolve_trace_path(path)
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.num_requests = num_requests
        self.time_scale = float(time_scale)
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        rows = read_mooncake_rows(self.path, self.block_size)
        order = sorted(range(len(rows)), key=lambda i: rows[i].timestamp_ms)  # stable: ties by row
        if self.num_requests is not None:
            order = order[:self.num_requests]
        max_hash_id = max((max(r.hash_ids) for r in rows), default=0)
        synth = BlockTokenSynthesizer(self.vocab_size, self.block_size, self.seed, max_hash_id)
        kept = [rows[i] for i in order]
        flat_hashes = np.fromiter((h for r in kept for h in r.hash_ids), dtype=np.int64)
        flat_offsets = synth.offsets(flat_hashes).tolist()
        width = rid_width(len(rows))
        specs = []
        start = 0
        for index, row in zip(order, kept):
            end = start + len(row.hash_ids)
            specs.append(RequestSpec(
                rid=f"mooncake-{index:0{width}d}",
                arrival_s=row.timestamp_ms / 1000.0 * self.time_scale,
                input_ids=synth.prompt(flat_offsets[start:end], row.input_len_tokens),
                output_len=clamp_output_len(row.output_len_tokens),
            ))
            start = end
        return sorted_specs(specs)
