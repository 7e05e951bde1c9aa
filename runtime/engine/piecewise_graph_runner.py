"""Piecewise CUDA graphs for extend and mixed steps (SGLang's piecewise CUDA graph): per token-count bucket,
the forward is captured as one graph per stretch between attention cores -- embedding + layer 0 up to its
rotated q/k, then each layer's o_proj, MLP/MoE, norms and the next layer's projections, then the final
norm -- and every layer's attention core (KV store, attention over the planned batch) runs eagerly between
the replays, on the real tokens only. Under tensor parallelism every GPU of the group captures the same
buckets in the same order, the pieces holding the layers' all-reduces as the decode graphs do (the ranks
run the same step, so they pad to the same bucket). Imports torch; never imported by runtime/core or sim/.

Legend: T = real new tokens, P = padded tokens (a captured size), H = hidden. Padding rows carry token 0 at
position 0 through the static pieces only: they never reach the KV pool or attention, their attention
output rows hold stale values, and their hidden states are dropped.
"""
from __future__ import annotations

import gc
from collections.abc import Callable

import torch
from torch import nn

from runtime.core.graph_grids import padded_size
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.kv_pool import KVPool
from runtime.models.base import AttentionCore, StepContext


class _Handoff:
    """Static tensors [P_max, *tail] shared by every layer and bucket: attention-core inputs are copied in
    at the end of a piece (inside its graph); the core's output is copied in before the next piece reads it."""

    def __init__(self, max_tokens: int, device: torch.device) -> None:
        self.max_tokens, self.device = max_tokens, device
        self.buffers: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        full = (key, tail, dtype)
        if full not in self.buffers:
            self.buffers[full] = torch.zeros(self.max_tokens, *tail, dtype=dtype, device=self.device)
        return self.buffers[full]


class _Core:
    """One layer's attention core as replays call it: the function and its static input/output buffers."""

    def __init__(self, fn: AttentionCore, inputs: list[torch.Tensor], output: torch.Tensor) -> None:
        self.fn, self.inputs, self.output = fn, inputs, output

    def run(self, num_tokens: int, ctx: StepContext) -> None:
        out = self.fn(*(buf[:num_tokens] for buf in self.inputs), ctx)          # [T, *tail]
        self.output[:num_tokens].copy_(out)


class PiecewiseGraphRunner:
    """Captures every bucket of `token_buckets` for `model` (fused small ops required) and replays extend /
    mixed steps of at most max(token_buckets) new tokens. The attention cores run on
    `backend` (the runner's eager backend, planned once per step here). All pieces share one memory pool;
    buckets are captured largest first. `capture=False` captures nothing: `run_uncaptured` then runs the
    same data flow (padding, handoff buffers, cores on the real tokens) with the pieces as plain Python --
    how CPU tests check the split points."""

    def __init__(self, model: nn.Module, pool: KVPool, backend, token_buckets: list[int], device: torch.device,
                 progress: bool = True, capture: bool = True) -> None:
        if getattr(model, "small_ops", None) is None:
            raise ValueError("piecewise CUDA graphs need the fused small ops (fast path)")
        self.model, self.pool, self.backend, self.device = model, pool, backend, device
        self.buckets = sorted(set(token_buckets))
        max_tokens = self.buckets[-1]
        long = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(max_tokens, **long)                       # [P_max]
        self.positions = torch.zeros(max_tokens, **long)                       # [P_max]
        hidden, dtype = model.config.hidden_size, model.dtype
        self.hidden = torch.zeros(max_tokens, hidden, dtype=dtype, device=device)   # [P_max, H] final-normed
        self.handoff = _Handoff(max_tokens, device)
        self.pieces: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.cores: dict[int, list[_Core]] = {}
        self.num_replays = 0                  # steps replayed so far (warm-up included)
        if capture:
            self.mempool = torch.cuda.graph_pool_handle()
            self._capture_all(progress)

    # -- capture ---------------------------------------------------------------------------
    def _capture_batch(self, num_tokens: int) -> ForwardBatch:
        """What the static pieces read: input ids and positions (views of the static buffers). The other
        fields belong to attention cores, which never run inside a capture."""
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        return ForwardBatch(
            input_ids=self.input_ids[:num_tokens], positions=self.positions[:num_tokens], out_cache_loc=empty,
            seq_lens=empty, prefix_lens=empty, extend_lens=empty, qo_indptr=empty.int(), kv_indptr=empty.int(),
            kv_indices=empty.int(), logits_indices=empty, is_decode=empty.bool(), seq_lens_cpu=[],
            prefix_lens_cpu=[], extend_lens_cpu=[], attn_backend=self.backend)

    def _forward(self, num_tokens: int, split: Callable) -> None:
        hidden = self.model.hidden_states(self._capture_batch(num_tokens), self.pool, split=split)   # [P, H]
        self.hidden[:num_tokens].copy_(hidden)

    def _splitter(self, num_tokens: int, cores: list[_Core], on_split: Callable[[], None] | None):
        """The StepContext.split of one bucket's forward: copies the core's inputs into the handoff
        buffers, records the core, calls on_split (ends a piece, begins the next), returns the static
        output rows the rest of the layer reads."""
        def split(core: AttentionCore, out_tail: tuple[int, ...], inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            statics = []
            for i, tensor in enumerate(inputs):
                buf = self.handoff.get(("in", i), tuple(tensor.shape[1:]), tensor.dtype)
                buf[:num_tokens].copy_(tensor)
                statics.append(buf)
            output = self.handoff.get(("out",), tuple(out_tail), inputs[0].dtype)
            cores.append(_Core(core, statics, output))
            if on_split is not None:
                on_split()
            return output[:num_tokens]
        return split

    @torch.no_grad()
    def _capture_all(self, progress: bool) -> None:
        from tqdm import tqdm

        stream = torch.cuda.Stream(self.device)
        for num_tokens in tqdm(sorted(self.buckets, reverse=True), desc="capture piecewise CUDA graphs",
                               disable=not progress):
            self.input_ids[:num_tokens].zero_()
            self.positions[:num_tokens].zero_()
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):               # warm-up: JIT, autotune, allocator
                for _ in range(2):
                    self._forward(num_tokens, self._splitter(num_tokens, [], None))
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            gc.collect()
            pieces: list[torch.cuda.CUDAGraph] = []
            cores: list[_Core] = []

            def next_piece() -> None:
                pieces[-1].capture_end()
                pieces.append(torch.cuda.CUDAGraph())
                pieces[-1].capture_begin(pool=self.mempool)

            with torch.cuda.stream(stream):
                pieces.append(torch.cuda.CUDAGraph())
                pieces[-1].capture_begin(pool=self.mempool)
                try:
                    self._forward(num_tokens, self._splitter(num_tokens, cores, next_piece))
                finally:
                    pieces[-1].capture_end()
            torch.cuda.synchronize(self.device)
            self.pieces[num_tokens], self.cores[num_tokens] = pieces, cores

    # -- replay ----------------------------------------------------------------------------
    def bucket(self, fb: ForwardBatch) -> int | None:
        """The captured token count this step pads to, or None: a decode-only step (decode graphs or
        eager, as in SGLang, whose piecewise graphs serve extend batches) or more new tokens than the
        largest."""
        if fb.all_decode:
            return None
        return padded_size(fb.num_tokens, self.buckets)

    def _prepare(self, fb: ForwardBatch, num_padded: int) -> StepContext:
        """Static inputs for fb padded to num_padded tokens; the attention plan; the cores' context."""
        num_tokens = fb.num_tokens
        self.input_ids[:num_tokens].copy_(fb.input_ids)
        self.input_ids[num_tokens:num_padded].zero_()
        self.positions[:num_tokens].copy_(fb.positions)
        self.positions[num_tokens:num_padded].zero_()
        fb.attn_backend = self.backend
        if hasattr(self.backend, "plan_step"):
            self.backend.plan_step(fb)                    # once per step, before any core
        return StepContext(fb, self.pool, self.backend, None, None, self.model.small_ops)

    def _logits(self, fb: ForwardBatch) -> torch.Tensor:
        return self.model.compute_logits(self.hidden[:fb.num_tokens][fb.logits_indices])   # [B, V]

    @torch.no_grad()
    def replay(self, fb: ForwardBatch, num_padded: int,
               between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Logits [B, V] float32 of step fb: pieces replayed, attention cores run on fb's T real tokens.
        `between_layers`: called on the host after each layer's launch (the driver hands out the step
        ahead's tokens there once the device has finished it)."""
        ctx = self._prepare(fb, num_padded)
        pieces, cores = self.pieces[num_padded], self.cores[num_padded]
        self.num_replays += 1
        for piece, core in zip(pieces, cores):
            piece.replay()
            core.run(fb.num_tokens, ctx)
            if between_layers is not None:
                between_layers()
        pieces[-1].replay()
        return self._logits(fb)

    @torch.no_grad()
    def run_uncaptured(self, fb: ForwardBatch, num_padded: int) -> torch.Tensor:
        """What `replay` computes, with each piece run as Python instead of replayed (no CUDA needed)."""
        ctx = self._prepare(fb, num_padded)
        cores: list[_Core] = []
        self._forward(num_padded, self._splitter(num_padded, cores, lambda: cores[-1].run(fb.num_tokens, ctx)))
        return self._logits(fb)
