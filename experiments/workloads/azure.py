"""Azure LLM inference trace 2023 (Splitwise): real arrivals and lengths, random token ids.

CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps like "2023-11-16 18:17:03.9799600".
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from experiments.workloads.arrivals import rng_for
from experiments.workloads.base import check_common_args, clamp_output_len, rid_width, sorted_specs
from experiments.workloads.paths import resolve_trace_path
from experiments.workloads.tokens import random_prompts
from experiments.workloads.trace_io import trace_error
from runtime.core.request import RequestSpec

AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def _parse_count(text: str, name: str, min_value: int, path: Path, line_no: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise trace_error(path, line_no, f"{name} must be an integer, got {text!r}") from None
    if value < min_value:
        raise trace_error(path, line_no, f"{name} must be >= {min_value}, got {value}")
    return value


def _parse_timestamps_ns(texts: list[str], line_nos: list[int], path: Path) -> np.ndarray:
    """Nanoseconds since the epoch [N], vectorised; on failure, find and name the bad line."""
    try:
        stamps = np.array(texts, dtype="datetime64[ns]")
        bad = np.flatnonzero(np.isnat(stamps))
    except ValueError:
        bad = [i for i, text in enumerate(texts) if not _is_timestamp(text)]
    if len(bad):
        i = int(bad[0])
        raise trace_error(path, line_nos[i], f"TIMESTAMP is not a date-time: {texts[i]!r}")
    return stamps.astype(np.int64)


def _is_timestamp(text: str) -> bool:
    try:
        return not np.isnat(np.datetime64(text, "ns"))
    except ValueError:
        return False


def read_azure_rows(path: Path) -> tuple[np.ndarray, list[int], list[int]]:
    """(timestamps_ns [N], context tokens, generated tokens) of an Azure trace CSV; ValueError
    naming file and line on a wrong header, a wrong column count, a bad date-time, a
    non-integer count, ContextTokens < 1 or GeneratedTokens < 0."""
    texts, line_nos, contexts, generated = [], [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != AZURE_HEADER:
            raise trace_error(path, 1, f"expected header {','.join(AZURE_HEADER)}, got {header}")
        for fields in reader:
            line_no = reader.line_num
            if not fields:
                continue
            if len(fields) != 3:
                raise trace_error(path, line_no, f"expected 3 columns, got {len(fields)}")
            texts.append(fields[0])
            line_nos.append(line_no)
            contexts.append(_parse_count(fields[1], "ContextTokens", 1, path, line_no))
            generated.append(_parse_count(fields[2], "GeneratedTokens", 0, path, line_no))
    return _parse_timestamps_ns(texts, line_nos, path), contexts, generated


class AzureWorkload:
    """One request per CSV row (rid "azure-<0-based data row>"), arriving (TIMESTAMP - earliest
    TIMESTAMP) * time_scale seconds after the start, at 100 ns precision. Prompts are seeded
    random ids with no shared prefixes (the trace has no prefix information). GeneratedTokens
    0 becomes output_len 1 (see clamp_output_len). num_requests (None = all) keeps the first
    rows in arrival order. A relative path is taken from the repository root.
    """

    def __init__(self, *, vocab_size: int,
                 path: str = "../shared/data/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                 num_requests: int | None = None, time_scale: float = 1.0, seed: int = 0) -> None:
        check_common_args(num_requests, time_scale, vocab_size)
        self.path = resolve_trace_path(path)
        self.vocab_size = vocab_size
        self.num_requests = num_requests
        self.time_scale = float(time_scale)
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        stamps_ns, contexts, generated = read_azure_rows(self.path)
        order = np.argsort(stamps_ns, kind="stable")[:self.num_requests].tolist()
        start_ns = int(stamps_ns.min()) if len(stamps_ns) else 0
        prompts = random_prompts(rng_for(self.seed, "azure.tokens"), [contexts[i] for i in order],
                                 self.vocab_size)
        width = rid_width(len(contexts))
        return sorted_specs([
            RequestSpec(rid=f"azure-{i:0{width}d}",
                        arrival_s=(int(stamps_ns[i]) - start_ns) / 1e9 * self.time_scale,
                        input_ids=prompt, output_len=clamp_output_len(generated[i]))
            for i, prompt in zip(order, prompts)
        ])
