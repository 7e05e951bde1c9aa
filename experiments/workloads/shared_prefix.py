"""SGLang bench_serving's "generated-shared-prefix" dataset: groups of prompts that share a
random system prompt, each followed by its own random question; shuffled across groups."""
from __future__ import annotations

import math

import numpy as np

from experiments.workloads.arrivals import check_arrival_args, gamma_arrivals_s, parse_rate, rng_for
from experiments.workloads.base import check_common_args, rid_width, sorted_specs
from experiments.workloads.tokens import check_length_args, random_prompts, uniform_lengths
from runtime.core.request import RequestSpec


class SharedPrefixWorkload:
    """num_groups x prompts_per_group requests; prompt = system prompt of its group + question.

    Guarantees (while num_groups * prompts_per_group <= vocab_size): two prompts of one group
    share exactly their group's system prompt (questions start with distinct tokens); prompts
    of different groups share no leading token. Prompts are shuffled across groups, as SGLang
    does without --gsp-ordered, so a cache-aware policy has something to reorder.
    Lengths are fixed at range_ratio=1, else uniform in [len*range_ratio, len] (per group for
    the system prompt, per prompt for question and output). Arrivals: Poisson at request_rate
    (req/s; inf = all at t=0), times multiplied by time_scale. num_requests (None = all)
    keeps the first requests in arrival order. rids: "gsp-<index>-g<group>-q<question>".

    Defaults (8 x 16 at t=0, SGLang's 2048/128/256 lengths) keep the first waiting queue at
    128 requests: SGLang's LPM falls back to FCFS above 128 waiting requests.
    """

    def __init__(self, *, vocab_size: int, num_groups: int = 8, prompts_per_group: int = 16,
                 system_prompt_len: int = 2048, question_len: int = 128, output_len: int = 256,
                 range_ratio: float = 1.0, request_rate: float = math.inf,
                 num_requests: int | None = None, time_scale: float = 1.0, seed: int = 0) -> None:
        check_common_args(num_requests, time_scale, vocab_size)
        if num_groups < 1 or prompts_per_group < 1:
            raise ValueError(f"need num_groups >= 1 and prompts_per_group >= 1, got {num_groups}, {prompts_per_group}")
        if system_prompt_len < 0 or question_len < 1 or output_len < 1:
            raise ValueError("need system_prompt_len >= 0, question_len >= 1 and output_len >= 1, got "
                             f"{system_prompt_len}, {question_len}, {output_len}")
        self.vocab_size = vocab_size
        self.num_groups = num_groups
        self.prompts_per_group = prompts_per_group
        self.system_prompt_len = system_prompt_len
        self.question_len = question_len
        self.output_len = output_len
        self.range_ratio = float(range_ratio)
        self.request_rate = parse_rate(request_rate)
        self.num_requests = num_requests
        self.time_scale = float(time_scale)
        self.seed = seed
        check_arrival_args(self.request_rate)
        check_length_args(1, self.range_ratio)

    def requests(self) -> list[RequestSpec]:
        rng = rng_for(self.seed, "shared_prefix")
        num_total = self.num_groups * self.prompts_per_group
        question_lens = uniform_lengths(rng, num_total, self.question_len, self.range_ratio)
        output_lens = uniform_lengths(rng, num_total, self.output_len, self.range_ratio).tolist()
        systems = self._system_prompts(rng)
        questions = random_prompts(rng, question_lens, self.vocab_size)  # [group * P + question]

        order = rng.permutation(num_total)  # position -> (group, question) flat index
        count = num_total if self.num_requests is None else min(self.num_requests, num_total)
        arrivals_s = gamma_arrivals_s(rng_for(self.seed, "shared_prefix.arrivals"), num_total, self.request_rate)
        width = rid_width(num_total)
        specs = []
        for position in range(count):
            flat = int(order[position])
            group, question = divmod(flat, self.prompts_per_group)
            specs.append(RequestSpec(
                rid=f"gsp-{position:0{width}d}-g{group}-q{question}",
                arrival_s=float(arrivals_s[position]) * self.time_scale,
                input_ids=systems[group] + questions[flat],
                output_len=int(output_lens[flat]),
            ))
        return sorted_specs(specs)

    def _system_prompts(self, rng: np.random.Generator) -> list[tuple[int, ...]]:
        if self.system_prompt_len == 0:
            return [()] * self.num_groups
        lens = uniform_lengths(rng, self.num_groups, self.system_prompt_len, self.range_ratio)
        return random_prompts(rng, lens, self.vocab_size)
