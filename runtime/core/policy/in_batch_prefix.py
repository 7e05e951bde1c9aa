"""In-batch prefix caching (SGLang's SchedulePolicy._compute_prefix_matches): among waiting
requests whose cached prefix is short, the ones that share a long prefix with an earlier such
request are deprioritized (moved behind the others, still admitted when the budget allows), so
that most of them hit the first one's prefix in the cache a step later.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.request import Request


def deprioritized(ordered: list[Request], match_lengths: dict[Request, int],
                  threshold_tokens: int) -> set[Request]:
    """The requests to move back: a request whose cached match is <= threshold_tokens and whose
    tokens share >= threshold_tokens with an earlier such request (earlier in `ordered`) that
    was not itself deprioritized. Sharing >= threshold tokens with one of those is having the
    same first `threshold_tokens` tokens, so a set of heads is all the bookkeeping needed.
    threshold_tokens <= 0 turns it off (SGLang: -1)."""
    moved: set[Request] = set()
    if threshold_tokens <= 0:
        return moved
    seen: set[tuple[int, ...]] = set()
    for req in ordered:
        if match_lengths[req] > threshold_tokens:
            continue
        head = req.input_ids[:threshold_tokens]
        if len(head) < threshold_tokens:            # the output tokens continue the sequence
            head = [*head, *req.output_ids][:threshold_tokens]
        if len(head) < threshold_tokens:            # too short to share threshold tokens
            continue
        key = tuple(head)
        if key in seen:
            moved.add(req)
        else:
            seen.add(key)
    return moved
