"""Time a full load of each real trace: `python -m experiments.workloads.bench_load [name ...]`.

Prints requests, prompt tokens, wall and CPU seconds and the peak RSS; a script, not a test.
"""
from __future__ import annotations

import resource
import sys
import time

from experiments.workloads.arxiv_lengths import ArxivWorkload
from experiments.workloads.azure import AzureWorkload
from experiments.workloads.mooncake import MooncakeWorkload
from experiments.workloads.sharegpt_multiturn import ShareGPTMultiturnWorkload

VOCAB_SIZE = 102_400  # DeepSeek-V2-Lite
DATA = "../shared/data"
LOADERS = {
    "mooncake_conversation": lambda: MooncakeWorkload(vocab_size=VOCAB_SIZE),
    "mooncake_synthetic": lambda: MooncakeWorkload(vocab_size=VOCAB_SIZE, path=f"{DATA}/mooncake/synthetic_trace.jsonl"),
    "azure_conv": lambda: AzureWorkload(vocab_size=VOCAB_SIZE),
    "azure_code": lambda: AzureWorkload(vocab_size=VOCAB_SIZE,
                                        path=f"{DATA}/azure_llm_2023/AzureLLMInferenceTrace_code.csv"),
    "sharegpt_multiturn": lambda: ShareGPTMultiturnWorkload(vocab_size=VOCAB_SIZE),
    "arxiv_all": lambda: ArxivWorkload(vocab_size=VOCAB_SIZE, num_requests=None),
}


def main(names: list[str]) -> None:
    for name in names or list(LOADERS):
        wall_s, cpu_s = time.perf_counter(), time.process_time()
        specs = LOADERS[name]().requests()
        wall_s, cpu_s = time.perf_counter() - wall_s, time.process_time() - cpu_s
        num_tokens = sum(len(s.input_ids) for s in specs)
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        print(f"{name:24s} {len(specs):7d} req {num_tokens / 1e6:8.1f} M tokens  wall {wall_s:6.2f} s  "
              f"cpu {cpu_s:6.2f} s  peak rss {peak_gb:5.2f} GB", flush=True)
        del specs


if __name__ == "__main__":
    main(sys.argv[1:])
