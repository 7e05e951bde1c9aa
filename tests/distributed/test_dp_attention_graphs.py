"""CUDA graphs under DP attention, on CPU (gloo): what a replay computes -- every rank's decode batch padded
to the agreed size P at the dummy KV slot, an idle rank P padding rows, the token exchange at P rows per
rank as captured -- gives each attention rank the whole model's logits (fp32, <= 1e-5 relative); the
leaders derive the round's graph size from its shapes and hand it to the runner and to the rest of their
attention TP group; the runner replays exactly the agreed size (or runs eagerly), and refuses a batch
that cannot replay it. The capture and replay themselves run on GPUs (tests/distributed/test_gpu_layouts.py)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.distributed.lockstep import Lockstep, RankStep  # noqa: E402
from runtime.distributed.step_channel import STOP  # noqa: E402
from runtime.distributed.worker import follow  # noqa: E402
from runtime.dp_attention_graphs import dp_attention_graph_bs  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from sim.costmodel.base import StepShape  # noqa: E402

RTOL = 1e-5
GRID = [1, 2, 4, 8]
NUM_SLOTS = 256                 # per rank; slot NUM_SLOTS is the dummy slot padding rows use


def tiny_hf_config() -> dict:
    return OmegaConf.to_container(compose_config(["model=tiny_mla_moe"]).model.hf_config, resolve=True)


# -- what a replay computes, on every rank -----------------------------------------------------
class Sequences:
    """Each attention rank's sequences over its own KV pool: prefills, then one decode token at a time."""

    def __init__(self, vocab: int) -> None:
        self.gen = torch.Generator().manual_seed(5)
        self.vocab, self.slots, self.next_slot = vocab, {}, [0, 0]

    def _new_slots(self, rank: int, n: int) -> list[int]:
        start = self.next_slot[rank]
        self.next_slot[rank] += n
        return list(range(start, start + n))

    def prefill(self, rank: int, name: str, n: int) -> tuple:
        self.slots[name] = self._new_slots(rank, n)
        return torch.randint(0, self.vocab, (n,), generator=self.gen).tolist(), 0, list(self.slots[name])

    def decode(self, rank: int, name: str) -> tuple:
        prefix = len(self.slots[name])
        self.slots[name] += self._new_slots(rank, 1)
        return torch.randint(0, self.vocab, (1,), generator=self.gen).tolist(), prefix, list(self.slots[name])


def step_batches(vocab: int) -> list[list]:
    """Per step, each attention rank's batch [(new ids, prefix length, slots)], or None (idle)."""
    s = Sequences(vocab)
    return [
        [[s.prefill(0, "a", 9), s.prefill(0, "b", 6)], [s.prefill(1, "c", 5), s.prefill(1, "d", 4), s.prefill(1, "e", 3)]],
        [[s.decode(0, "a"), s.decode(0, "b")], [s.decode(1, "c"), s.decode(1, "d"), s.decode(1, "e")]],   # P = 4
        [[s.decode(0, "a"), s.decode(0, "b")], None],                                                   # P = 2, idle
        [None, [s.decode(1, "c")]],                                                                     # P = 1
        [[s.prefill(0, "f", 4), s.decode(0, "a")], [s.decode(1, "d")]],                                 # eager
        [[s.decode(0, "f")], [s.decode(1, "d"), s.decode(1, "e")]],                                     # P = 2
    ]


def _shape(batch) -> StepShape:
    if batch is None:
        return StepShape()
    if all(len(new) == 1 and prefix > 0 for new, prefix, _ in batch):
        return StepShape(num_decode_reqs=len(batch), decode_context_tokens=sum(len(slots) for _, _, slots in batch))
    return StepShape(tuple(len(new) for new, _, _ in batch), tuple(p for _, p, _ in batch))


def graph_sizes(steps) -> list[int | None]:
    return [dp_attention_graph_bs([_shape(b) for b in batches], GRID) for batches in steps]


def padded_replay_logits(info, groups, hf_config: dict, steps: list, sizes: list) -> list:
    """Each step as a rank runs it: eagerly with the round's token counts, or as the graph of size P
    computes it -- the static inputs filled and padded to P (DecodeGraphInputs, as CudaGraphRunner
    replays), the exchange as at capture (every rank P rows), the forward over all P rows."""
    from runtime.distributed.dp_attention import dp_attention_parallel
    from runtime.engine.cuda_graph_runner import DecodeGraphInputs
    from runtime.engine.kv_pool import create_kv_pool
    from runtime.engine.model_runner import rank_config
    from runtime.models.loader import build_model

    parallel, exchange = dp_attention_parallel(info, groups)
    model = build_model(hf_config, torch.float32, "cpu", seed=0, parallel=parallel)
    pool = create_kv_pool(rank_config(model.config, model), NUM_SLOTS + 1, torch.float32, "cpu")
    inputs = DecodeGraphInputs(max(GRID), 2 * NUM_SLOTS + max(GRID), NUM_SLOTS, "cpu")
    out = []
    for batches, bs in zip(steps, sizes):
        mine = batches[info.replica]
        if bs is None:
            exchange.set_step_tokens([sum(len(new) for new, _, _ in b) if b else 0 for b in batches])
            if mine is None:
                model.idle_step()
            else:
                out.append(model(ForwardBatch.build(mine, "cpu"), pool))
            continue
        exchange.set_step_tokens(None)                # captured with every rank at P rows
        if mine is None:
            inputs.fill_dummy(bs)
        else:
            inputs.fill(ForwardBatch.build(mine, "cpu"), bs)
        logits = model(inputs.forward_batch(bs), pool)          # [P, V]
        if mine is not None:
            out.append(logits[:len(mine)].clone())
    return out


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2-dp2", "tp4-dp2"])
def test_padded_replays_give_each_rank_the_whole_models_logits(tp):
    from runtime.distributed.spawn import run_on_ranks
    from runtime.engine.kv_pool import create_kv_pool
    from runtime.engine.model_runner import rank_config
    from runtime.models.loader import build_model

    hf_config = tiny_hf_config()
    steps = step_batches(hf_config["vocab_size"])
    sizes = graph_sizes(steps)
    assert sizes == [None, 4, 2, 1, None, 2]
    results = run_on_ranks(padded_replay_logits, tp, hf_config, steps, sizes, dp_attention=2)
    whole = build_model(hf_config, torch.float32, "cpu", seed=0)
    per_rank = tp // 2
    for replica in range(2):
        pool = create_kv_pool(rank_config(whole.config, whole), NUM_SLOTS, torch.float32, "cpu")
        reference = [whole(ForwardBatch.build(b[replica], "cpu"), pool) for b in steps if b[replica] is not None]
        for rank in range(replica * per_rank, (replica + 1) * per_rank):    # every GPU of the attention rank
            got = results[rank]
            assert len(got) == len(reference) == 5
            for mine, ref in zip(got, reference):
                mine = torch.as_tensor(mine)
                assert mine.shape == ref.shape
                assert ((mine - ref).abs().max() / ref.abs().max()).item() <= RTOL


def test_padding_rows_only_touch_the_dummy_slot():
    from runtime.engine.cuda_graph_runner import DecodeGraphInputs

    inputs = DecodeGraphInputs(8, 64, dummy_slot=99, device="cpu")
    fb = ForwardBatch.build([([5], 3, [10, 11, 12, 13]), ([6], 1, [20, 21])], "cpu")
    kv_indptr = inputs.fill(fb, 4)
    assert kv_indptr == [0, 4, 6, 7, 8]
    assert inputs.out_cache_loc[:4].tolist() == [13, 21, 99, 99]
    assert inputs.kv_indices[:8].tolist() == [10, 11, 12, 13, 20, 21, 99, 99]
    assert inputs.fill_dummy(4) == [0, 1, 2, 3, 4]                # an idle rank: every row padding
    assert inputs.out_cache_loc[:4].tolist() == [99] * 4 and inputs.kv_indices[:4].tolist() == [99] * 4


# -- the leaders agree, the runner follows ----------------------------------------------------
class FakeGraphs:
    def __init__(self, sizes=GRID, max_kv_tokens=10_000) -> None:
        self.batch_sizes, self.max_kv_tokens = sizes, max_kv_tokens
        self.graphs = dict.fromkeys(sizes)
        self.calls: list = []

    def accepts(self, fb, bs) -> bool:
        return fb.all_decode and fb.batch_size <= bs

    def bucket(self, fb):
        self.calls.append(("own", fb.batch_size))
        return None

    def replay(self, fb, bs):
        self.calls.append(("replay", fb.batch_size, bs))
        return torch.zeros(fb.batch_size, 4)

    def replay_idle(self, bs) -> None:
        self.calls.append(("idle", bs))


class FakeRunner:
    def __init__(self, graphs=None) -> None:
        self.graphs, self.steps = graphs, []

    def set_step_graph(self, bs) -> None:
        self.steps.append(("graph", bs))

    def idle_step(self) -> None:
        self.steps.append(("idle",))

    def run(self, inputs) -> None:
        self.steps.append(("run", inputs))


class FakeExchange:
    step_tokens = None

    def set_step_tokens(self, tokens) -> None:
        self.step_tokens = tokens


class FakeChannel:
    def __init__(self, messages=()) -> None:
        self.sent, self.messages = [], list(messages)

    def send(self, message) -> None:
        self.sent.append(message)

    def recv(self):
        return self.messages.pop(0)


class ScriptedLockstep(Lockstep):
    """The rounds' all-gather replaced by what the other leaders report."""

    def __init__(self, others: list, *args) -> None:
        super().__init__(None, 2, *args)
        self.others = others

    def _round(self, shape, done):
        self.rounds += 1
        return [(shape, done), self.others.pop(0)]


def test_leaders_set_the_rounds_graph_on_the_runner_and_tell_their_group():
    runner, exchange, channel = FakeRunner(FakeGraphs([1, 2, 4, 8, 12, 16])), FakeExchange(), FakeChannel()
    lockstep = ScriptedLockstep([(StepShape(num_decode_reqs=10, decode_context_tokens=100), False),
                                 (StepShape((64,), (0,)), False),
                                 (StepShape(num_decode_reqs=5, decode_context_tokens=50), False),
                                 (None, False), (None, True)],
                                exchange, runner, channel)
    assert runner.steps == [("graph", None)]                       # the runner follows the rounds from now on
    lockstep.agree(StepShape(num_decode_reqs=3, decode_context_tokens=30))
    assert exchange.step_tokens == [3, 10] and runner.steps[-1] == ("graph", 12)   # the larger batch's size
    lockstep.agree(StepShape(num_decode_reqs=3, decode_context_tokens=30))   # the other rank prefills
    assert exchange.step_tokens == [3, 64] and runner.steps[-1] == ("graph", None)
    assert lockstep.idle_round(done=False) == (False, True)        # the other decodes 5: replay 8 idle
    assert runner.steps[-2:] == [("graph", 8), ("idle",)]
    assert channel.sent == [RankStep(None, [0, 5], 8)]
    assert lockstep.idle_round(done=False) == (False, False)       # nobody runs: no step at all
    assert lockstep.idle_round(done=True) == (True, False)            # every rank done
    assert (lockstep.graph_steps, lockstep.idle_steps, lockstep.rounds) == (2, 1, 5)


def test_a_leader_without_graphs_agrees_on_eager_steps():
    runner = FakeRunner(None)
    lockstep = ScriptedLockstep([(StepShape(num_decode_reqs=1, decode_context_tokens=9), False)],
                                FakeExchange(), runner)
    lockstep.agree(StepShape(num_decode_reqs=1, decode_context_tokens=9))
    assert runner.steps == [("graph", None), ("graph", None)] and lockstep.graph_steps == 0


def test_the_rest_of_an_attention_group_follows_the_leaders_graph():
    runner, exchange = FakeRunner(), FakeExchange()
    channel = FakeChannel([RankStep("inputs", [2, 3], 4), RankStep(None, [0, 7], 8), RankStep("more", [9, 1], None), STOP])
    assert follow(runner, channel, exchange) == 2
    assert runner.steps == [("graph", None), ("graph", 4), ("run", "inputs"), ("graph", 8), ("idle",),
                            ("graph", None), ("run", "more")]
    assert exchange.step_tokens == [9, 1]


@pytest.fixture(scope="module")
def cpu_runner():
    return ModelRunner(tiny_hf_config(), 64, device="cpu", dtype="float32")


def _decodes(n: int) -> ForwardBatch:
    return ForwardBatch.build([([1], 2, [3 * i, 3 * i + 1, 3 * i + 2]) for i in range(n)], "cpu")


def test_the_runner_replays_exactly_the_agreed_graph(cpu_runner):
    runner = cpu_runner
    runner.graphs, runner.graphs_agreed, runner.step_graph_bs = FakeGraphs(), False, None
    try:
        runner.forward(_decodes(3))                            # before any round: its own choice (warm-up)
        assert runner.graphs.calls == [("own", 3)]
        runner.set_step_graph(8)
        assert runner.forward(_decodes(3)).shape == (3, 4)     # padded to the agreed 8, not its own 4
        runner.idle_step()
        assert runner.graphs.calls[1:] == [("replay", 3, 8), ("idle", 8)]
        runner.set_step_graph(None)                            # another rank prefills: eager, fits a graph or not
        assert runner.forward(_decodes(3)).shape == (3, runner.model.config.vocab_size)
        assert len(runner.graphs.calls) == 3
        runner.set_step_graph(2)
        with pytest.raises(RuntimeError, match="batch of 3 sequences .* cannot replay the agreed graph of 2"):
            runner.forward(_decodes(3))
        with pytest.raises(RuntimeError, match="graph of 16 rows, which this rank did not capture"):
            runner.set_step_graph(16)
    finally:
        runner.graphs, runner.graphs_agreed, runner.step_graph_bs = None, False, None
