"""CUDA graphs for decode steps: capture the whole model forward (embed -> layers -> logits) once per
batch-size bucket, then per step copy the real batch into static buffers, pad it to the bucket, plan
attention on the host, replay, and hand back the real rows' logits.

Legend: B = real sequences, P = padded batch (a captured size), K = KV tokens attended (sum of seq_lens),
V = vocab. Padding rows are decode tokens of one KV token each, stored at and reading `dummy_slot` (a slot
the core's allocator never hands out), so they cannot disturb real slots; their logits are dropped.
Under DP attention every rank of a step replays the same size, agreed between them
(runtime.dp_attention_graphs): the token exchange inside the graph is captured at P rows per rank, and a
rank without requests that step replays P padding rows (`replay_idle`).
Nothing in the captured region may sync with the host: attention is FlashInfer/Triton over static
indptr/indices, MoE is the Triton fused MoE (routing is softmax/sigmoid + top-k: static shapes, no sync).
"""
from __future__ import annotations

import gc

import torch
from torch import nn

from runtime.core.graph_grids import capture_batch_sizes, padded_size  # noqa: F401 (re-exported)
from runtime.engine.fast_path import MLAShape
from runtime.engine.forward_batch import ForwardBatch, cpu_int32
from runtime.engine.kv_pool import MLAKVPool


def padded_kv_indptr(seq_lens: list[int], padded_bs: int) -> list[int]:
    """[P + 1] CSR offsets: the real sequences' lengths, then one KV token per padding row."""
    if padded_bs < len(seq_lens):
        raise ValueError(f"cannot pad {len(seq_lens)} sequences to {padded_bs}")
    out = [0]
    for n in list(seq_lens) + [1] * (padded_bs - len(seq_lens)):
        out.append(out[-1] + n)
    return out


class DecodeGraphInputs:
    """The static tensors a captured graph reads (sized for the largest bucket) and the ForwardBatch
    views over them. Works on any device, so the padding logic is testable on CPU."""

    def __init__(self, max_bs: int, max_kv_tokens: int, dummy_slot: int, device: torch.device | str):
        self.max_bs, self.max_kv_tokens, self.dummy_slot = max_bs, max_kv_tokens, dummy_slot
        long = dict(dtype=torch.long, device=device)
        int32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(max_bs, **long)                          # [P_max]
        self.positions = torch.zeros(max_bs, **long)                          # [P_max]
        self.out_cache_loc = torch.full((max_bs,), dummy_slot, **long)        # [P_max]
        self.seq_lens = torch.ones(max_bs, **long)                            # [P_max]
        self.kv_indptr = torch.arange(max_bs + 1, **int32)                    # [P_max + 1]
        self.kv_indices = torch.full((max_kv_tokens,), dummy_slot, **int32)   # [K_max]
        self.arange = torch.arange(max_bs + 1, **long)                        # logits rows, qo_indptr
        self.ones = torch.ones(max_bs, **long)
        self.true = torch.ones(max_bs, dtype=torch.bool, device=device)

    def forward_batch(self, bs: int) -> ForwardBatch:
        """A decode batch of bs rows over the static buffers (what a graph of size bs captures)."""
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs], out_cache_loc=self.out_cache_loc[:bs],
            seq_lens=self.seq_lens[:bs], prefix_lens=self.seq_lens[:bs] - 1, extend_lens=self.ones[:bs],
            qo_indptr=self.arange[:bs + 1].to(torch.int32), kv_indptr=self.kv_indptr[:bs + 1],
            kv_indices=self.kv_indices, logits_indices=self.arange[:bs], is_decode=self.true[:bs],
            seq_lens_cpu=[1] * bs, prefix_lens_cpu=[1] * bs, extend_lens_cpu=[1] * bs)

    def fits(self, fb: ForwardBatch, bs: int) -> bool:
        return sum(fb.seq_lens_cpu) + (bs - fb.batch_size) <= self.max_kv_tokens

    def fill(self, fb: ForwardBatch, bs: int) -> list[int]:
        """Copy decode batch fb (B rows) into the buffers, padded to bs rows; returns the padded
        kv_indptr (host list). Device-side copies only, except the small indptr upload (from pinned memory,
        so it does not wait for the work queued before it)."""
        real = fb.batch_size
        kv_indptr = padded_kv_indptr(fb.seq_lens_cpu, bs)
        num_real_kv = kv_indptr[real]
        self.input_ids[:real].copy_(fb.input_ids)
        self.input_ids[real:bs].zero_()
        self.positions[:real].copy_(fb.positions)
        self.positions[real:bs].zero_()
        self.out_cache_loc[:real].copy_(fb.out_cache_loc)
        self.out_cache_loc[real:bs].fill_(self.dummy_slot)
        self.seq_lens[:real].copy_(fb.seq_lens)
        self.seq_lens[real:bs].fill_(1)
        self.kv_indices[:num_real_kv].copy_(fb.kv_indices[:num_real_kv])
        self.kv_indices[num_real_kv:kv_indptr[bs]].fill_(self.dummy_slot)
        self.kv_indptr[:bs + 1].copy_(cpu_int32(kv_indptr), non_blocking=True)
        return kv_indptr

    def fill_dummy(self, bs: int) -> list[int]:
        """Every row a padding row (capture and warm-up)."""
        kv_indptr = padded_kv_indptr([], bs)
        self.input_ids[:bs].zero_()
        self.positions[:bs].zero_()
        self.out_cache_loc[:bs].fill_(self.dummy_slot)
        self.seq_lens[:bs].fill_(1)
        self.kv_indices[:bs].fill_(self.dummy_slot)
        self.kv_indptr[:bs + 1].copy_(cpu_int32(kv_indptr), non_blocking=True)
        return kv_indptr


class CudaGraphRunner:
    """One captured decode forward per size in `batch_sizes`, all in one memory pool; logits land in one
    static [P_max, V] float32 buffer (copied inside the graph, so captures do not each keep their own)."""

    def __init__(self, model: nn.Module, pool: MLAKVPool, shape: MLAShape, kernel: str,
                 batch_sizes: list[int], dummy_slot: int, max_kv_tokens: int, device: torch.device,
                 progress: bool = True) -> None:
        self.model, self.pool, self.device = model, pool, device
        self.batch_sizes = sorted(set(batch_sizes))
        max_bs = self.batch_sizes[-1]
        self.inputs = DecodeGraphInputs(max_bs, max_kv_tokens, dummy_slot, device)
        from runtime.engine.gqa_backend import make_graph_backend   # MLA or GQA, as the model is
        self.backend = make_graph_backend(model, shape.dtype, device, max_bs, max_kv_tokens, kernel)
        self.logits = torch.zeros(max_bs, model.config.vocab_size, dtype=torch.float32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.num_replays = 0          # replays so far (warm-up included)
        self._batches: dict[int, ForwardBatch] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self._capture_all(progress)

    # -- capture ---------------------------------------------------------------------------
    def _run(self, bs: int) -> None:
        self.logits[:bs].copy_(self.model(self._batches[bs], self.pool))   # [P, V]

    def _plan(self, bs: int, kv_indptr: list[int]) -> None:
        """Host-side attention schedule for the next replay of size bs (outside the graph)."""
        if self.backend.flashinfer is not None:
            self.backend.plan_flashinfer(
                cpu_int32(list(range(bs + 1))), cpu_int32(kv_indptr), self.inputs.kv_indices[:kv_indptr[-1]],
                cpu_int32([b - a for a, b in zip(kv_indptr, kv_indptr[1:])]), causal=False)

    @torch.no_grad()
    def _capture_all(self, progress: bool) -> None:
        from tqdm import tqdm

        stream = torch.cuda.Stream(self.device)
        sizes = sorted(self.batch_sizes, reverse=True)    # largest first: the pool is sized once
        for bs in tqdm(sizes, desc="capture decode CUDA graphs", disable=not progress):
            fb = self.inputs.forward_batch(bs)
            fb.attn_backend = self.backend
            self._batches[bs] = fb
            self._plan(bs, self.inputs.fill_dummy(bs))
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):               # warm-up: JIT, autotune, allocator
                for _ in range(2):
                    self._run(bs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            gc.collect()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool, stream=stream):
                self._run(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)

    # -- replay ----------------------------------------------------------------------------
    @property
    def max_kv_tokens(self) -> int:
        return self.inputs.max_kv_tokens

    def bucket(self, fb: ForwardBatch) -> int | None:
        """The captured size this batch replays with, or None (not all decode, too large, too much KV)."""
        if not fb.all_decode:
            return None
        bs = padded_size(fb.batch_size, self.batch_sizes)
        if bs is None or not self.accepts(fb, bs):
            return None
        return bs

    def accepts(self, fb: ForwardBatch, bs: int) -> bool:
        """Whether decode batch fb can replay the graph of captured size bs (padded up to it)."""
        return (bs in self.graphs and fb.all_decode and fb.batch_size <= bs
                and self.inputs.fits(fb, bs))

    @torch.no_grad()
    def replay(self, fb: ForwardBatch, bs: int) -> torch.Tensor:
        """Logits [B, V] float32 of decode batch fb: a view into the static buffer, valid until the
        next replay."""
        self._plan(bs, self.inputs.fill(fb, bs))
        self.graphs[bs].replay()
        self.num_replays += 1
        return self.logits[:fb.batch_size]

    @torch.no_grad()
    def replay_idle(self, bs: int) -> None:
        """DP attention: a step with no sequence of this rank while others decode -- the graph of size bs
        over padding rows only (its collectives pair with the other ranks' replays); logits dropped."""
        self._plan(bs, self.inputs.fill_dummy(bs))
        self.graphs[bs].replay()
        self.num_replays += 1
