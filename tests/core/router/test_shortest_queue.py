"""Shortest-queue routing: the replica with the fewest requests in flight."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.router.shortest_queue import ShortestQueueRouter
from tests.core.router.specs import distinct


def test_balanced_load_spreads_evenly() -> None:
    router = ShortestQueueRouter(num_replicas=4)
    picks = [router.route(distinct(i), now=0.0) for i in range(8)]
    assert picks == [0, 1, 2, 3, 0, 1, 2, 3]
    assert router.in_flight.counts == [2, 2, 2, 2]


def test_follows_finishes_to_the_emptiest_replica() -> None:
    router = ShortestQueueRouter(num_replicas=3)
    for i in range(6):
        router.route(distinct(i), now=0.0)          # [2, 2, 2]
    router.finish(2)
    router.finish(2)                                # [2, 2, 0]
    assert [router.route(distinct(10 + i), now=1.0) for i in range(3)] == [2, 2, 0]
    assert router.in_flight.counts == [3, 2, 2]


def test_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="num_replicas=0"):
        ShortestQueueRouter(num_replicas=0)


def test_yaml_builds_it() -> None:
    router = instantiate(OmegaConf.load("conf/router/shortest_queue.yaml"))(num_replicas=2)
    assert isinstance(router, ShortestQueueRouter)
