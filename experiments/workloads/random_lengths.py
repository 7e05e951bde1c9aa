"""SGLang bench_serving's "random" dataset: random token ids, uniform random lengths and
gamma-distributed inter-arrivals (burstiness)."""
from __future__ import annotations

import math

from experiments.workloads.arrivals import check_arrival_args, gamma_arrivals_s, parse_rate, rng_for
from experiments.workloads.base import check_common_args, rid_width, sorted_specs
from experiments.workloads.tokens import check_length_args, random_prompts, uniform_lengths
from runtime.core.request import RequestSpec

DEFAULT_NUM_REQUESTS = 256


class RandomWorkload:
    """num_requests (None = 256) requests with seeded pseudo-random prompts (no two share a
    leading token while num_requests <= vocab_size).

    Input and output lengths are uniform in [max(1, int(len * range_ratio)), len]
    (range_ratio 1 = fixed). Inter-arrivals ~ Gamma(shape=burstiness, mean=1/request_rate):
    burstiness 1 is Poisson, < 1 burstier (CV = 1/sqrt(burstiness)); request_rate inf puts
    all requests at t=0. Arrival times are multiplied by time_scale. rids: "rand-<index>".
    Prefix-stable: num_requests=k gives the first k requests of any larger draw.
    """

    def __init__(self, *, vocab_size: int, input_len: int = 1024, output_len: int = 1024,
                 range_ratio: float = 0.0, request_rate: float = math.inf, burstiness: float = 1.0,
                 num_requests: int | None = None, time_scale: float = 1.0, seed: int = 0) -> None:
        check_common_args(num_requests, time_scale, vocab_size)
        check_length_args(input_len, range_ratio)
        check_length_args(output_len, range_ratio)
        check_arrival_args(parse_rate(request_rate), float(burstiness))
        self.vocab_size = vocab_size
        self.input_len = input_len
        self.output_len = output_len
        self.range_ratio = float(range_ratio)
        self.request_rate = parse_rate(request_rate)
        self.burstiness = float(burstiness)
        self.num_requests = DEFAULT_NUM_REQUESTS if num_requests is None else num_requests
        self.time_scale = float(time_scale)
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        count = self.num_requests
        # one stream per quantity: the first k requests do not depend on num_requests
        input_lens = uniform_lengths(rng_for(self.seed, "random.input_lens"), count, self.input_len, self.range_ratio)
        output_lens = uniform_lengths(rng_for(self.seed, "random.output_lens"), count, self.output_len,
                                      self.range_ratio).tolist()
        prompts = random_prompts(rng_for(self.seed, "random.tokens"), input_lens, self.vocab_size)
        arrivals_s = gamma_arrivals_s(rng_for(self.seed, "random.arrivals"), count, self.request_rate, self.burstiness)
        width = rid_width(count)
        return sorted_specs([
            RequestSpec(rid=f"rand-{i:0{width}d}", arrival_s=float(arrivals_s[i]) * self.time_scale,
                        input_ids=prompts[i], output_len=int(output_lens[i]))
            for i in range(count)
        ])
