"""How much of a batch's attended KV is read by more than one request: radix-cache prefixes that several
running requests hold (a shared system prompt, a conversation's history). Decode attention reads them once
per request; cost models price the repeats apart (they hit in the GPU's L2 when read close together).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from typing import Iterable

from runtime.core.request import Request


def shared_prefix_tokens(requests: Iterable[Request]) -> int:
    """Sum over the requests of their cache-held prefix tokens, less the distinct tokens of those
    prefixes: the KV tokens each read again after another request of the set read them. A request's
    prefix is the path from the radix root to `cache_node`, `num_locked_prefix_tokens` long; O(distinct
    nodes on the paths)."""
    seen: set[int] = set()
    held = distinct = 0
    for req in requests:
        if not req.num_locked_prefix_tokens:
            continue
        held += req.num_locked_prefix_tokens
        node = req.cache_node
        while node is not None and node.parent is not None and id(node) not in seen:
            seen.add(id(node))
            distinct += len(node.key)
            node = node.parent
    return held - distinct
