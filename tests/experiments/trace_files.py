"""Writers of tiny trace files in the real formats (Mooncake, Azure, ShareGPT multi-turn), so
workload tests never need ../shared/data."""
from __future__ import annotations

import json
import math
from pathlib import Path


def mooncake_row(timestamp_ms: int, hash_ids: list[int], input_length: int | None = None,
                 output_length: int = 8, block_size: int = 512) -> dict:
    """A valid row; input_length defaults to full blocks."""
    if input_length is None:
        input_length = block_size * len(hash_ids)
    assert len(hash_ids) == math.ceil(input_length / block_size)
    return {"timestamp": timestamp_ms, "input_length": input_length, "output_length": output_length,
            "hash_ids": hash_ids}


def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    """Rows as JSON lines; a str row is written verbatim (to plant a malformed line)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_azure(path: Path, rows: list[tuple[str, int, int]], header: str = "TIMESTAMP,ContextTokens,GeneratedTokens") -> Path:
    path.write_text(header + "\n" + "".join(f"{t},{c},{g}\n" for t, c, g in rows))
    return path


def sharegpt_row(arrival_ns: int, input_ids: list[int], output_ids: list[int]) -> dict:
    return {"input_toks": len(input_ids), "output_toks": len(output_ids), "arrival_time_ns": arrival_ns,
            "input_tok_ids": input_ids, "output_tok_ids": output_ids}


def default_traces(folder: Path) -> dict[str, Path]:
    """One small valid trace per format, for tests that treat all workloads alike."""
    mooncake = write_jsonl(folder / "mooncake.jsonl", [
        mooncake_row(0, [0, 1, 2]), mooncake_row(0, [0, 1, 3], input_length=1100),
        mooncake_row(250, [0, 4]), mooncake_row(1250, [5], input_length=7, output_length=0),
        mooncake_row(1250, [0, 1, 2, 6], output_length=3),
    ])
    azure = write_azure(folder / "azure.csv", [
        ("2023-11-16 18:15:46.6805900", 40, 4), ("2023-11-16 18:15:46.6805901", 30, 0),
        ("2023-11-16 18:15:50.9951690", 20, 7), ("2023-11-16 18:16:01.0000000", 10, 2),
    ])
    sharegpt = write_jsonl(folder / "sharegpt.jsonl", [
        sharegpt_row(46_926_808, [5, 6, 7], [8, 9]),
        sharegpt_row(347_938_951, [5, 6, 7, 8, 9, 130_000], [11]),
        sharegpt_row(479_613_520, [1, 2], [3, 4, 5]),
    ])
    arxiv = folder / "arxiv.csv"
    arxiv.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                     + "".join(f"{10 + i},{i % 3},{10 + i + i % 3},1.0\n" for i in range(40)))
    return {"mooncake": mooncake, "azure": azure, "sharegpt": sharegpt, "arxiv": arxiv}
