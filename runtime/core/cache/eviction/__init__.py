"""Eviction policies for the radix cache, one file per policy; chosen by Hydra `_target_`."""
