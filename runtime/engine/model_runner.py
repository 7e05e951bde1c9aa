"""Executes a core StepPlan on a torch model: builds the ForwardBatch from the plan's slot
indices, runs the model over the paged KV pool, samples one token per sampling item.
On CUDA with a FastPathConfig: FlashInfer/Triton MLA + Triton fused MoE, decode through CUDA graphs.

Imports torch; never imported by runtime/core or sim/.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from runtime.core.batch import StepPlan, StepResult
from runtime.core.memory_budget import SLOT_TABLE_EXTRA_ROWS
from runtime.core.request import SamplingParams
from runtime.distributed.sharding import SINGLE, ModelParallel
from runtime.engine.fast_path import (
    FastPathConfig, enable_fast_path, torch_reference_experts, torch_reference_small_ops,
)
from runtime.engine.batch_builder import BatchBuilder, FutureTokens, HostBatch
from runtime.engine.forward_batch import ForwardBatch, _to_device
from runtime.engine.kv_pool import create_kv_pool
from runtime.engine.logprob_params import top_logprobs_num
from runtime.engine.penalties import PenaltyBook, PenaltyCounts, PenaltyInputs
from runtime.engine.prompt_logprobs import PromptAsk, PromptLogprobs, prompt_asks
from runtime.engine.sampler import SampledLogprobs, Sampler, is_greedy, pinned
from runtime.models.config import ModelConfig
from runtime.models.loader import build_model

WARM_SAMPLING_ROWS = (1, 3, 16, 128)     # batch sizes the warm-up samples at
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _warm_requests(ids: list[int], slots: list[int], parts: int) -> list[tuple[list[int], int, list[int]]]:
    """`parts` requests over consecutive pieces of already written slots, each extending the last three
    quarters of its piece over the first quarter: (new ids, prefix length, the piece's slots)."""
    bounds = [len(ids) * i // parts for i in range(parts + 1)]
    out = []
    for start, end in zip(bounds, bounds[1:]):
        prefix = (end - start) // 4
        out.append((ids[start + prefix:end], prefix, slots[start:end]))
    return out


class ModelRunner:
    """The real executor: `execute(plan) -> StepResult` (tokens in plan.sampling_items order,
    duration measured on the wall clock after the device finished)."""

    def __init__(self, hf_config: dict, num_kv_slots: int, device: str = "auto", dtype: str = "bfloat16",
                 load_format: str = "dummy", path: str | None = None, seed: int = 0,
                 fast: FastPathConfig | None = None, max_running_requests: int = 1024,
                 max_context_tokens: int | None = None, parallel: ModelParallel = SINGLE) -> None:
        """fast: None (default) = the torch reference everywhere; on CPU it is ignored either way.
        max_running_requests / max_context_tokens size the request->slot table (rows, columns).
        parallel: this rank's shard of a tensor-/expert-parallel model (runtime.distributed); every rank
        of the group builds the same runner and runs every step (`run`), the scheduling rank `launch`es."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        self.device = resolve_device(device)
        self.dtype = DTYPES[dtype]
        start = time.perf_counter()
        self.model = build_model(hf_config, self.dtype, self.device, load_format, path, seed, parallel)
        config = rank_config(ModelConfig.from_hf(hf_config), self.model)
        self.step_sender: Callable[[StepInputs], None] | None = None   # TP leader: hands each step to its peers
        self.attn_backend = None      # FastMLABackend when the fast path is on
        self.graphs = None            # CudaGraphRunner when decode graphs are captured
        self.piecewise = None         # PiecewiseGraphRunner when extend steps replay graph pieces
        # DP attention: the decode graph size every rank replays this step, agreed between the ranks
        # (runtime.distributed.lockstep); None = eager. Only once `graphs_agreed` (serving) does it
        # override the runner's own choice; warm-up runs the same forwards on every rank.
        self.graphs_agreed, self.step_graph_bs = False, None
        if fast is not None and fast.enabled:
            self.attn_backend = enable_fast_path(self.model, config, self.dtype, self.device, fast.mla_kernel,
                                                 fast.fused_small_ops, fast.layer_fusions)
        use_graphs = fast is not None and fast.enabled and fast.cuda_graph and self.attn_backend is not None
        if fast is not None and fast.cuda_graph and self.device.type == "cuda" and not use_graphs:
            warnings.warn("cuda_graph needs the fast path; decode runs eagerly")
        # graphs: one extra slot past the core's capacity, where padding rows write
        self.pool = create_kv_pool(config, num_kv_slots + (1 if use_graphs else 0), self.dtype, self.device)
        self.sampler = Sampler(device=self.device, seed=seed)
        self.penalty_book = PenaltyBook()                # which penalised request holds which state row
        self.penalty_counts = PenaltyCounts(self.device)  # their running token counts (every rank)
        self.prompt_logprobs = PromptLogprobs(self.model.compute_logits)
        rows = max_running_requests + SLOT_TABLE_EXTRA_ROWS   # + the chunked request, finished ones in flight
        columns = min(max_context_tokens or config.max_position_embeddings, num_kv_slots) + 2
        self.future = FutureTokens(4 * rows, self.device)
        self.batches = BatchBuilder(rows, columns, self.device, self.future)
        if use_graphs:
            self.graphs = self._capture(fast, num_kv_slots)
        if use_graphs and fast.piecewise_cuda_graph:
            if parallel.tokens is not None or self.model.small_ops is None:
                warnings.warn("piecewise CUDA graphs need the fused small ops and no DP attention; extend steps "
                              "run eagerly")
            else:
                self.piecewise = self._capture_piecewise(fast)
        self._sync()
        self.load_time_s = time.perf_counter() - start

    def _capture(self, fast: FastPathConfig, num_kv_slots: int):
        from runtime.engine.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes

        sizes = list(fast.cuda_graph_batch_sizes or capture_batch_sizes(fast.cuda_graph_max_bs))
        # KV tokens one replay may attend: shared radix prefixes can make it exceed the pool size
        max_kv_tokens = 2 * num_kv_slots + max(sizes)
        return CudaGraphRunner(self.model, self.pool, self.attn_backend.shape, self.attn_backend.kernel,
                               sizes, dummy_slot=num_kv_slots, max_kv_tokens=max_kv_tokens, device=self.device,
                               progress=fast.progress)

    def _capture_piecewise(self, fast: FastPathConfig):
        from runtime.core.graph_grids import extend_token_buckets
        from runtime.engine.piecewise_graph_runner import PiecewiseGraphRunner

        buckets = list(fast.piecewise_token_buckets or extend_token_buckets(fast.piecewise_max_tokens))
        return PiecewiseGraphRunner(self.model, self.pool, self.attn_backend, buckets, self.device,
                                    progress=fast.progress)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def forward(self, fb: ForwardBatch, path: str = "auto", poll: Callable[[], None] | None = None) -> torch.Tensor:
        """Logits [B, V] (float32). path: auto (a decode graph when a decode batch fits a captured
        size, else piecewise graph pieces when the step's new tokens fit a captured count, else eager),
        eager (fast kernels, no graphs), reference (torch reference kernels). Without a fast path every
        choice is the reference. A replay's logits may be a view that the next replay overwrites.
        `poll`: called on the host between the layers of a piecewise replay (see `launch`)."""
        if path not in ("auto", "eager", "reference"):
            raise ValueError(f"path {path!r}: expected auto, eager or reference")
        if path == "reference":
            with torch_reference_experts(self.model), torch_reference_small_ops(self.model):
                fb.attn_backend = None
                return self.model(fb, self.pool)
        if path == "auto" and self.graphs is not None:
            bs = self._agreed_bucket(fb) if self.graphs_agreed else self.graphs.bucket(fb)
            if bs is not None:
                return self.graphs.replay(fb, bs)
        if path == "auto" and self.piecewise is not None:
            num_padded = self.piecewise.bucket(fb)
            if num_padded is not None:
                return self.piecewise.replay(fb, num_padded, between_layers=poll)
        return self.model.compute_logits(self._eager_hidden_states(fb)[fb.logits_indices])

    def set_step_graph(self, bs: int | None) -> None:
        """DP attention: the decode graph size the ranks agreed on for the next step (None: every rank
        runs it eagerly). From the first call on, `forward` and `idle_step` follow the agreed choice
        instead of choosing by this rank's own batch: a rank that chose alone would leave the others'
        collectives unpaired."""
        if bs is not None and (self.graphs is None or bs not in self.graphs.graphs):
            raise RuntimeError(f"the ranks agreed on a decode graph of {bs} rows, which this rank did not capture")
        self.graphs_agreed, self.step_graph_bs = True, bs

    def _agreed_bucket(self, fb: ForwardBatch) -> int | None:
        bs = self.step_graph_bs
        if bs is not None and not self.graphs.accepts(fb, bs):
            raise RuntimeError(f"a batch of {fb.batch_size} sequences ({'decode' if fb.all_decode else 'not all decode'}, "
                               f"{sum(fb.seq_lens_cpu)} KV tokens) cannot replay the agreed graph of {bs} rows")
        return bs

    @torch.no_grad()
    def idle_step(self) -> None:
        """DP attention: a step in which this rank has no tokens while others run theirs -- the agreed
        decode graph over padding rows only, or (eager) the model's idle step (its MLP share)."""
        if self.graphs_agreed and self.step_graph_bs is not None:
            self.graphs.replay_idle(self.step_graph_bs)
        else:
            self.model.idle_step()

    def _eager_hidden_states(self, fb: ForwardBatch) -> torch.Tensor:
        """Final hidden states of every new token [T, H] by the eager path (`forward`'s eager branch
        takes the LM head of each sequence's last one)."""
        if self.attn_backend is not None:
            fb.attn_backend = self.attn_backend
            self.attn_backend.plan_step(fb)       # once per step, before any layer
        return self.model.hidden_states(fb, self.pool)

    @torch.no_grad()
    def warmup(self, prefill_tokens: list[int]) -> float:
        """Throw-away prefills of these lengths, each followed by one decode and by an extend of its
        second half over the first (a chunk continuation's kernels), before serving, so just-in-time
        kernels (Triton, FlashInfer) compile now rather than inside the first steps. Writes KV only
        into slots no request owns yet (a request reads only slots it wrote). Returns the seconds it took."""
        start = time.perf_counter()
        vocab = self.model.config.vocab_size
        table = self.batches.table           # warm-up sequences use its rows 0..B-1 (see _warm_batch)
        limit = min(self.pool.num_slots - 1, table.max_context_tokens)
        for num_tokens in prefill_tokens:
            n = max(2, min(num_tokens, limit))
            ids, slots = [i % vocab for i in range(n)], list(range(n))
            logits = self.forward(self._warm_batch([(ids[:-1], 0, slots[:-1])]))   # [1, V]
            self.forward(self._warm_batch([(ids[-1:], n - 1, slots)]))
            prefix = n // 2                   # the second half again, over the first half's KV
            self.forward(self._warm_batch([(ids[prefix:], prefix, slots)]))
            for parts in (3, 16):             # several requests a step (kernels specialise a count of 1 or 16k)
                if n >= 4 * parts and parts <= table.num_rows:
                    self.forward(self._warm_batch(_warm_requests(ids, slots, parts)))
        if prefill_tokens:
            self._warm_sampling(logits)
        self._sync()
        return time.perf_counter() - start

    def _warm_batch(self, seqs: list[tuple[list[int], int, list[int]]]) -> ForwardBatch:
        """A warm-up step built as served steps are (BatchBuilder.to_device: slot-table writes, the
        kv_indices kernel), over table rows 0..B-1, which no request owns yet (a request's row is
        rewritten from column 0 when it is assigned). seqs: (new ids, prefix length, all slots)."""
        writes = [np.stack([np.full(len(slots), row, dtype=np.int64), np.arange(len(slots), dtype=np.int64),
                            np.asarray(slots, dtype=np.int64)]) for row, (_, _, slots) in enumerate(seqs)]
        batch = HostBatch([list(ids) for ids, _, _ in seqs], [prefix for _, prefix, _ in seqs],
                          [slots[prefix:] for _, prefix, slots in seqs],
                          [len(ids) == 1 and prefix > 0 for ids, prefix, _ in seqs],
                          np.arange(len(seqs), dtype=np.int32), np.concatenate(writes, axis=1))
        return self.batches.to_device(batch)

    def _warm_sampling(self, logits: torch.Tensor) -> None:
        """The sampler's kernels and the pinned host copies that end a step, at a few batch sizes, for
        greedy, plain and filtered (top-k, top-p, min-p, seeded) sampling with log-probabilities: the
        first served step otherwise pays for them (~0.3 s on an H200). A throw-away Sampler: the runner's
        keeps its random stream. `logits`: [1, V] from a warm-up forward."""
        sampler = Sampler(device=self.device, seed=0)
        kinds = (GREEDY, SamplingParams(), SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=0))
        for rows in WARM_SAMPLING_ROWS:
            batch = logits[:1].expand(rows, -1).contiguous()                 # [rows, V]
            for params in kinds:
                ids = sampler.sample(batch, [params] * rows, [0] * rows)     # [rows]
                logprobs = sampler.logprobs(batch, [params] * rows, ids, [5] * rows)
                if self.device.type == "cuda":                               # a CUDA step ends with these
                    pinned(ids)
                    logprobs.to_host()

    # -- steps ---------------------------------------------------------------------------
    def clock_origin(self):
        """The origin launched steps report their device times against (a CUDA event recorded on an
        idle stream; on CPU the host clock)."""
        if self.device.type != "cuda":
            return time.perf_counter()
        self._sync()
        origin = torch.cuda.Event(enable_timing=True)
        origin.record()
        return origin

    def prepare(self, plan: StepPlan) -> StepInputs:
        """The host half of a step (reads the plan, keeps the slot table's and the future ring's
        bookkeeping): what `run` needs on every rank."""
        rows = [i for i, it in enumerate(plan.items) if it.samples]
        items = [plan.items[i] for i in rows]
        sampling = [it.request.sampling for it in items]
        top_nums = [top_logprobs_num(s) for s in sampling]
        asks = any(k is not None for k in top_nums)
        penalties = self.penalty_book.inputs([it.request for it in items], sampling)
        return StepInputs(self.batches.host(plan), rows, self.future.reserve(len(rows)),
                          None if all(map(is_greedy, sampling)) and not asks else sampling,
                          [len(it.request.output_ids) for it in items], top_nums if asks else None,
                          # a prompt's log-probabilities: asked by a sampling row's request, or by a chunk's
                          prompt_asks(plan) if asks or len(rows) < len(plan.items) else None, penalties)

    @torch.no_grad()
    def run(self, inputs: StepInputs, poll: Callable[[], None] | None = None
            ) -> tuple[torch.Tensor, SampledLogprobs | None]:
        """The device half: forward, sampling, sampled tokens into the future ring (where the next
        step's inputs read them). Returns the token ids [S] on the device, without waiting for them,
        and the log-probabilities of the rows that ask (None when none does).
        Every rank of a TP group runs it on the same inputs: the logits are gathered whole on each, and
        the samplers (same seed, same calls) draw the same tokens, so no rank waits for another's."""
        fb = self.batches.to_device(inputs.batch)
        prompt = None
        if inputs.prompt_asks is not None:    # rows besides each sequence's last: eagerly, graphs keep none
            if self.graphs_agreed and self.step_graph_bs is not None:   # (prompts are never decode-only)
                raise RuntimeError("a step with prompt log-probabilities cannot replay the agreed decode graph")
            hidden = self._eager_hidden_states(fb)                            # [T, H]
            logits = self.model.compute_logits(hidden[fb.logits_indices])    # [B, V]
            prompt = self.prompt_logprobs.step(inputs.prompt_asks, hidden, fb.extend_lens_cpu)
        else:
            logits = self.forward(fb, poll=poll)                               # [B, V]
        rows = inputs.sample_rows
        if not rows:
            return torch.empty(0, dtype=torch.long, device=self.device), None
        sampling = inputs.sampling if inputs.sampling is not None else [GREEDY] * len(rows)
        if len(rows) < logits.shape[0]:       # a device index (a list index would upload it and wait)
            logits = logits.index_select(0, _to_device(np.asarray(rows, dtype=np.int64), self.device))  # [S, V]
        if inputs.penalties is not None:
            logits = self.penalty_counts.apply(logits, inputs.penalties, self.future.resolve)
        ids = self.sampler.sample(logits, sampling, inputs.output_positions)
        if inputs.penalties is not None:      # the sampled tokens join the running counts, on the device
            self.penalty_counts.cumulate(inputs.penalties, ids)
        self.future.store(_to_device(inputs.ring, self.device), ids)   # pinned: never waits for the stream
        logprobs = None
        if inputs.top_logprobs_nums is not None:
            logprobs = self.sampler.logprobs(logits, sampling, ids, inputs.top_logprobs_nums)
        if prompt:                            # prompts finished this step: with their first token's entry
            logprobs.prompt = {rows.index(seq): values for seq, values in prompt.items()}
        return ids, logprobs

    @torch.no_grad()
    def launch(self, plan: StepPlan, poll: Callable[[], None] | None = None):
        """Enqueue the step (inputs, forward, sampling, token copy to the host) without waiting for
        the device; sampled tokens also land in the future ring, where the next step's inputs read
        them. On CPU the step runs to completion here. A TP leader hands the step's inputs to its
        peers (`step_sender`) before running it itself. `poll` (the overlap driver's): called on the
        host once the batch is built and between the layers of a piecewise replay, where the driver
        hands out the previous step's tokens as soon as the device has them instead of after this
        launch (a piecewise prefill keeps the host 6-9 ms)."""
        from runtime.driver import FinishedStep

        host_start = time.perf_counter()
        cuda = self.device.type == "cuda"
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        inputs = self.prepare(plan)
        if self.step_sender is not None:
            self.step_sender(inputs)
        if poll is not None and cuda:
            poll()
        ids, logprobs = self.run(inputs, poll=poll if cuda else None)
        placeholders = self.future.placeholders(inputs.ring)
        if not cuda:
            result = StepResult(next_token_ids=ids.tolist(), duration_s=time.perf_counter() - host_start,
                                logprobs=logprobs.entries(len(ids)) if logprobs is not None else None)
            step = FinishedStep(result, host_start, time.perf_counter())
            step.placeholder_ids = placeholders
            return step
        host_ids = torch.empty(ids.shape, dtype=torch.long, pin_memory=True)
        host_ids.copy_(ids, non_blocking=True)
        host_logprobs = logprobs.to_host() if logprobs is not None else None   # copied with the ids
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return _CudaStep(placeholders, host_ids, start, end, host_logprobs)

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        """launch + wait: one step, synchronously."""
        return self.launch(plan).wait()


@dataclass
class StepInputs:
    """One step as every rank runs it (picklable). sampling: per sampled row, or None = all greedy."""

    batch: HostBatch
    sample_rows: list[int]          # rows of the batch that sample a token
    ring: np.ndarray                # future-ring index of each sampled token
    sampling: list[SamplingParams] | None
    output_positions: list[int]     # per sampled row, len(request.output_ids)
    top_logprobs_nums: list[int | None] | None = None   # per sampled row (None: no logprobs); None: no row asks
    prompt_asks: list[PromptAsk] | None = None          # prefill chunks that want prompt log-probabilities
    penalties: PenaltyInputs | None = None              # penalised rows, their state rows' upkeep


GREEDY = SamplingParams(temperature=0.0)


def rank_config(config: ModelConfig, model: torch.nn.Module) -> ModelConfig:
    """The model config as this rank's KV pool sees it: GQA KV heads of its shard (MLA's latent KV is
    whole on every rank)."""
    from runtime.models.attention import Attention

    layer = next((m for m in model.modules() if isinstance(m, Attention)), None)
    if layer is None or layer.num_kv_heads == config.num_key_value_heads:
        return config
    return dataclasses.replace(config, num_key_value_heads=layer.num_kv_heads)


class _CudaStep:
    """A launched CUDA step: tokens (and the log-probabilities asked for) arrive in pinned host
    buffers; events time it on the device."""

    def __init__(self, placeholder_ids: list[int], host_ids: torch.Tensor, start: torch.cuda.Event,
                 end: torch.cuda.Event, host_logprobs: SampledLogprobs | None = None) -> None:
        self.placeholder_ids = placeholder_ids
        self._host_ids, self._start, self._end = host_ids, start, end
        self._host_logprobs = host_logprobs

    def done(self) -> bool:
        """True once the device has finished the step (its tokens are on the host): wait() returns at once."""
        return self._end.query()

    def wait(self) -> StepResult:
        self._end.synchronize()
        ids = self._host_ids.tolist()
        logprobs = self._host_logprobs.entries(len(ids)) if self._host_logprobs is not None else None
        return StepResult(next_token_ids=ids, duration_s=self._start.elapsed_time(self._end) / 1e3,
                          logprobs=logprobs)

    def interval_s(self, origin) -> tuple[float, float] | None:
        if not isinstance(origin, torch.cuda.Event):
            return None
        return origin.elapsed_time(self._start) / 1e3, origin.elapsed_time(self._end) / 1e3
