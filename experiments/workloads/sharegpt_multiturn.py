"""Multi-turn ShareGPT traces from LLMServingSim: real token ids (input = running context +
new prompt) and the real reply as expected output, so the simulator emits what was generated."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.workloads.base import check_common_args, clamp_output_len, rid_width, sorted_specs
from experiments.workloads.paths import resolve_trace_path
from experiments.workloads.tokens import TokenTupleBuilder
from experiments.workloads.trace_io import int_field, int_list_field, read_jsonl, trace_error
from runtime.core.request import RequestSpec


def _checked_ids(row: dict, ids_name: str, count_name: str, path: Path, line_no: int, min_count: int) -> list[int]:
    count = int_field(row, count_name, path, line_no, min_value=min_count)
    ids = int_list_field(row, ids_name, path, line_no)
    if len(ids) != count:
        raise trace_error(path, line_no, f"{count_name} is {count} but {ids_name} has {len(ids)} ids")
    return ids


class ShareGPTMultiturnWorkload:
    """One request per JSONL line (rid "sharegpt-<0-based line>") with fields input_toks,
    output_toks, arrival_time_ns, input_tok_ids, output_tok_ids; arrival_s =
    arrival_time_ns / 1e9 * time_scale (not rebased: the trace starts at ~0.05 s).

    Token ids >= vocab_size become id % vocab_size (deterministic; equal ids stay equal, so
    prefix sharing is kept, and distinct ids rarely merge). expected_output_ids are the mapped
    output_tok_ids and output_len = output_toks; output_toks 0 becomes output_len 1 with no
    expected ids. num_requests (None = all) keeps the first lines in arrival order. The seed is
    accepted for a uniform interface but unused: nothing is random. A relative path is taken
    from the repository root.
    """

    def __init__(self, *, vocab_size: int,
                 path: str = "../shared/data/llmservingsim_sharegpt/sharegpt-llama-3.1-8b-300-sps10.jsonl",
                 num_requests: int | None = None, time_scale: float = 1.0, seed: int = 0) -> None:
        check_common_args(num_requests, time_scale, vocab_size)
        self.path = resolve_trace_path(path)
        self.vocab_size = vocab_size
        self.num_requests = num_requests
        self.time_scale = float(time_scale)
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        builder = TokenTupleBuilder(self.vocab_size)
        rows = []
        for line_no, row in read_jsonl(self.path):
            arrival_ns = int_field(row, "arrival_time_ns", self.path, line_no)
            input_ids = _checked_ids(row, "input_tok_ids", "input_toks", self.path, line_no, min_count=1)
            output_ids = _checked_ids(row, "output_tok_ids", "output_toks", self.path, line_no, min_count=0)
            rows.append((arrival_ns, input_ids, output_ids))
        order = sorted(range(len(rows)), key=lambda i: rows[i][0])[:self.num_requests]
        width = rid_width(len(rows))
        specs = []
        for i in order:
            arrival_ns, input_ids, output_ids = rows[i]
            expected = tuple(self._mapped(builder, output_ids)) if output_ids else None
            specs.append(RequestSpec(
                rid=f"sharegpt-{i:0{width}d}", arrival_s=arrival_ns / 1e9 * self.time_scale,
                input_ids=tuple(self._mapped(builder, input_ids)),
                output_len=clamp_output_len(len(output_ids)), expected_output_ids=expected,
            ))
        return sorted_specs(specs)

    def _mapped(self, builder: TokenTupleBuilder, ids: list[int]) -> list[int]:
        return builder.as_list(np.asarray(ids, dtype=np.int64) % self.vocab_size)
