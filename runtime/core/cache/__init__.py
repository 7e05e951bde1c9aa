"""KV cache layer of the core: paged slot allocator, radix prefix cache, eviction policies.

Must not import torch, simpy or time.
"""
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.base import EvictionPolicy
from runtime.core.cache.radix_cache import MatchResult, RadixCache
from runtime.core.cache.tree_node import TreeNode

__all__ = ["EvictionPolicy", "KVSlotAllocator", "MatchResult", "RadixCache", "TreeNode"]
