"""Round-robin routing: cycles through replicas whatever the load or content."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.router.round_robin import RoundRobinRouter
from tests.core.router.specs import distinct, spec


def test_cycles_through_replicas_and_balances_counts() -> None:
    router = RoundRobinRouter(num_replicas=3)
    picks = [router.route(distinct(i), now=0.0) for i in range(7)]
    assert picks == [0, 1, 2, 0, 1, 2, 0]
    assert router.in_flight.counts == [3, 2, 2]


def test_ignores_load_and_content() -> None:
    router = RoundRobinRouter(num_replicas=2)
    same = [router.route(spec(f"r{i}", [1, 2, 3, 4]), now=float(i)) for i in range(4)]
    assert same == [0, 1, 0, 1]                    # identical prompts still alternate
    for _ in range(2):
        router.finish(0)
    assert router.route(distinct(9), now=5.0) == 0  # the turn, not the emptier replica...
    assert router.route(distinct(10), now=5.0) == 1  # ...decides


def test_finish_without_request_in_flight_is_an_error() -> None:
    router = RoundRobinRouter(num_replicas=2)
    router.route(distinct(0), now=0.0)
    router.finish(0)
    with pytest.raises(ValueError, match="replica 0 has no request in flight"):
        router.finish(0)


def test_yaml_builds_it() -> None:
    router = instantiate(OmegaConf.load("conf/router/round_robin.yaml"))(num_replicas=4)
    assert isinstance(router, RoundRobinRouter) and router.num_replicas == 4
