"""DP attention's lockstep (SGLang --enable-dp-attention): every attention rank's leader schedules its
own requests, and before each step any of them runs, the leaders agree on every rank's step in one
round (an all_gather_object of step shapes over their gloo group): its token counts size the model's
padded gather, its shapes price the step as the simulator does. A leader with nothing to run still
joins every round; when another rank runs, it runs its idle step (its MLP share of their tokens, as
SGLang's idle batch), and the run ends in the round where every rank reports done. The rest of an
attention TP group hears of each round through its leader's step broadcast (RankStep).

From the same shapes every leader derives the same decode graph for the round
(runtime.dp_attention_graphs): when no rank extends and the largest decode batch fits a captured size P,
every GPU replays the graph of size P (fewer requests padded to it, an idle rank P padding rows); else
every GPU runs the step eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

from runtime.core.batch import StepPlan
from runtime.core.request import Request
from runtime.dp_attention_graphs import dp_attention_graph_bs
from runtime.request_source import RequestSource
from sim.costmodel.base import StepShape

IDLE_POLL_S = 0.005      # an idle leader's longest wait between rounds (the others wait for it)


@dataclass
class RankStep:
    """A leader's broadcast to the rest of its attention TP group, for a round that runs a forward."""

    inputs: Any                # the runner's StepInputs; None: the idle step
    step_tokens: list[int]     # every attention rank's tokens this step
    graph_bs: int | None = None   # the decode graph every GPU replays (None: eager)


class Lockstep:
    """One leader's side of the rounds. `exchange`: the model's PaddedTokenExchange (its step token
    counts are set here); `runner`: the rank's ModelRunner (the round's decode graph is set on it, and
    it runs the idle step); `channel`: the StepChannel to the rest of its attention TP group (None: the
    group is this GPU alone)."""

    def __init__(self, group, num_ranks: int, exchange, runner, channel=None) -> None:
        self.group, self.num_ranks = group, num_ranks
        self.exchange, self.runner, self.channel = exchange, runner, channel
        graphs = runner.graphs          # the same captured sizes on every rank (same config)
        self.graph_sizes = list(graphs.batch_sizes) if graphs is not None else []
        self.graph_max_kv_tokens = graphs.max_kv_tokens if graphs is not None else None
        runner.set_step_graph(None)     # from now on the runner replays only what the ranks agree on
        self.rounds = 0
        self.idle_steps = 0
        self.graph_steps = 0            # rounds this rank ran (a step or its idle step) as a graph replay

    def _round(self, shape: StepShape | None, done: bool) -> list[tuple[StepShape | None, bool]]:
        entries: list = [None] * self.num_ranks
        dist.all_gather_object(entries, (shape, done), group=self.group)
        self.rounds += 1
        return entries

    def _set_step(self, shapes: list[StepShape]) -> int | None:
        """The exchange's token counts and the runner's decode graph for the round; returns the graph size."""
        self.exchange.set_step_tokens([s.num_tokens for s in shapes])
        graph_bs = dp_attention_graph_bs(shapes, self.graph_sizes, self.graph_max_kv_tokens)
        self.runner.set_step_graph(graph_bs)
        self.graph_steps += graph_bs is not None
        return graph_bs

    def agree(self, shape: StepShape) -> list[StepShape]:
        """A round in which this rank runs `shape`: every rank's shape (StepShape() for an idle one),
        the exchange set to their token counts and the runner to the round's decode graph."""
        shapes = [s if s is not None else StepShape() for s, _ in self._round(shape, False)]
        self._set_step(shapes)
        return shapes

    def idle_round(self, done: bool) -> tuple[bool, bool]:
        """A round in which this rank has nothing to run (`done`: and never will). Returns (every rank
        is done, another rank ran a step -- this one ran its idle step with it)."""
        entries = self._round(None, done)
        shapes = [s if s is not None else StepShape() for s, _ in entries]
        if not any(s.num_tokens for s in shapes):
            return all(d for _, d in entries), False
        graph_bs = self._set_step(shapes)
        if self.channel is not None:
            self.channel.send(RankStep(None, self.exchange.step_tokens, graph_bs))
        self.runner.idle_step()
        self.idle_steps += 1
        return False, True


class LockstepExecutor:
    """A DP attention leader's executor (runtime.executor.Executor around its ModelRunner): each launch
    first agrees on the step with the other leaders, then runs it, handing it to the rest of the
    attention TP group on the way."""

    def __init__(self, runner, lockstep: Lockstep) -> None:
        self.runner, self.lockstep = runner, lockstep
        self._shapes: dict[int, list[StepShape]] = {}     # id(plan) -> the round's shapes, until predicted
        if lockstep.channel is not None:
            runner.step_sender = lambda inputs: lockstep.channel.send(
                RankStep(inputs, lockstep.exchange.step_tokens, runner.step_graph_bs))

    def clock_origin(self):
        return self.runner.clock_origin()

    def launch(self, plan: StepPlan):
        self._shapes[id(plan)] = self.lockstep.agree(StepShape.from_plan(plan))
        return self.runner.launch(plan)

    def execute(self, plan: StepPlan):
        return self.launch(plan).wait()

    def predictor(self, cost_model) -> Callable[[StepPlan], float]:
        """The simulator's time for a launched step, from every rank's shape in its round
        (sim.costmodel.dp_attention.DPAttentionCostModel); called once per step, as the driver records it."""
        def predict(plan: StepPlan) -> float:
            return cost_model.step_time_s(self._shapes.pop(id(plan)))
        return predict


class LockstepSource:
    """Wraps a DP attention leader's request source: when the driver is idle, `exhausted()` joins a
    round (running the idle step if another rank runs), and is true only once every rank is done;
    `wait` then blocks at most IDLE_POLL_S, and not at all after an idle step (the others go on)."""

    def __init__(self, source: RequestSource, lockstep: Lockstep, has_work: Callable[[], bool]) -> None:
        self.source, self.lockstep, self.has_work = source, lockstep, has_work
        self._peers_busy = False

    def poll(self, now_s: float) -> list[Request]:
        return self.source.poll(now_s)

    def aborted_rids(self) -> list[str]:
        return self.source.aborted_rids()

    def exhausted(self) -> bool:
        mine = self.source.exhausted()
        if mine and self.has_work():       # work left but nothing planned: the driver reports the stall
            return True
        all_done, self._peers_busy = self.lockstep.idle_round(done=mine)
        return all_done

    def wait(self, now_s: float, timeout_s: float | None) -> None:
        if self._peers_busy:
            return
        self.source.wait(now_s, IDLE_POLL_S if timeout_s is None else min(timeout_s, IDLE_POLL_S))

    def on_tokens(self, requests: list[Request], now_s: float) -> None:
        self.source.on_tokens(requests, now_s)

    def on_finished(self, requests: list[Request], now_s: float) -> None:
        self.source.on_finished(requests, now_s)
