"""arXiv-summarization lengths (Vidur's processed trace: long prompts, short outputs) with
Poisson arrivals and random token ids; the file has no timestamps."""
from __future__ import annotations

import csv
from pathlib import Path

from experiments.workloads.arrivals import check_arrival_args, gamma_arrivals_s, parse_rate, rng_for
from experiments.workloads.base import check_common_args, clamp_output_len, rid_width, sorted_specs
from experiments.workloads.paths import resolve_trace_path
from experiments.workloads.tokens import random_prompts
from experiments.workloads.trace_io import trace_error
from runtime.core.request import RequestSpec


def read_length_pairs(path: Path) -> list[tuple[int, int]]:
    """(num_prefill_tokens, num_decode_tokens) per row; ValueError names file and line on a
    missing column, a non-integer, a prefill count < 1 or a negative decode count."""
    pairs = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        for name in ("num_prefill_tokens", "num_decode_tokens"):
            if name not in (reader.fieldnames or []):
                raise trace_error(path, 1, f"missing column {name!r}")
        for row in reader:
            line_no = reader.line_num
            try:
                prefill, decode = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])
            except (TypeError, ValueError):
                raise trace_error(path, line_no, "token counts must be integers") from None
            if prefill < 1 or decode < 0:
                raise trace_error(path, line_no, f"need num_prefill_tokens >= 1 and num_decode_tokens >= 0, "
                                                 f"got {prefill}, {decode}")
            pairs.append((prefill, decode))
    return pairs


class ArxivWorkload:
    """num_requests rows drawn without replacement (seeded; None = every row, shuffled) from the
    length file, arriving as a Poisson process at request_rate req/s (inf = all at t=0), times
    multiplied by time_scale. Random prompts, no shared prefixes; decode 0 becomes output_len 1.
    rids "arxiv-<index in draw order>". A relative path is taken from the repository root.
    """

    def __init__(self, *, vocab_size: int,
                 path: str = "../shared/data/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                 request_rate: float = 1.0, num_requests: int | None = 256, time_scale: float = 1.0,
                 seed: int = 0) -> None:
        check_common_args(num_requests, time_scale, vocab_size)
        check_arrival_args(parse_rate(request_rate))
        self.path = resolve_trace_path(path)
        self.vocab_size = vocab_size
        self.request_rate = parse_rate(request_rate)
        self.num_requests = num_requests
        self.time_scale = float(time_scale)
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        pairs = read_length_pairs(self.path)
        picked = rng_for(self.seed, "arxiv.rows").permutation(len(pairs))[:self.num_requests].tolist()
        prompts = random_prompts(rng_for(self.seed, "arxiv.tokens"), [pairs[i][0] for i in picked],
                                 self.vocab_size)
        arrivals_s = gamma_arrivals_s(rng_for(self.seed, "arxiv.arrivals"), len(picked), self.request_rate)
        width = rid_width(len(picked))
        return sorted_specs([
            RequestSpec(rid=f"arxiv-{k:0{width}d}", arrival_s=float(arrivals_s[k]) * self.time_scale,
                        input_ids=prompts[k], output_len=clamp_output_len(pairs[i][1]))
            for k, i in enumerate(picked)
        ])
