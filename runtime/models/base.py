"""The decoder-only skeleton every family shares: per-step context, pre-norm decoder layer, and the
causal LM (embed -> layers -> norm -> lm_head at logits_indices) with HF-name weight loading.

Legend: T = new tokens in the step, B = sequences, H = hidden, V = vocab.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from runtime.distributed.layers import VocabParallelEmbedding, gather_logits, vocab_parallel_lm_head
from runtime.distributed.sharding import SINGLE, ModelParallel, shard_spec
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.kv_pool import KVPool
from runtime.models.attention_backend import AttentionBackend, TorchAttentionBackend
from runtime.models.config import ModelConfig
from runtime.models.layers import Embedding, Linear, MergedLinear, RMSNorm, SmallOps
from runtime.models.moe import StackedExperts
from runtime.models.rotary import RotaryEmbedding

# HF linears merged into one of ours: (HF name fragment, our fragment, shard index)
GATE_UP_STACKED = ((".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1))
QKV_STACKED = ((".q_proj.", ".qkv_proj.", 0), (".k_proj.", ".qkv_proj.", 1), (".v_proj.", ".qkv_proj.", 2))

_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(?:(\d+)\.)?(gate_proj|up_proj|down_proj|gate_up_proj)(?:\.weight)?$")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


# core(*inputs, ctx) -> [T, *out_tail]: the part of a layer's attention that depends on the batch's
# sequence structure (KV store, planned attention kernels); everything around it has static shapes
AttentionCore = Callable[..., torch.Tensor]
AttentionSplit = Callable[[AttentionCore, tuple[int, ...], tuple[torch.Tensor, ...]], torch.Tensor]


@dataclass
class StepContext:
    """What every layer of one forward step reads (built once per step, never stored)."""

    fb: ForwardBatch
    pool: KVPool
    backend: AttentionBackend
    cos: torch.Tensor | None   # [T, R/2]; None when fused ops rotate from positions
    sin: torch.Tensor | None   # [T, R/2]
    ops: SmallOps | None = None   # fused small ops; None = the torch reference
    split: AttentionSplit | None = None   # piecewise CUDA-graph capture: ends one piece, begins the next

    def run_attention(self, core: AttentionCore, out_tail: tuple[int, ...], *inputs: torch.Tensor) -> torch.Tensor:
        """core(*inputs, self): [T, ...] inputs -> [T, *out_tail] in the inputs' dtype. Under piecewise
        capture (runtime/engine/piecewise_graph_runner.py) `split` takes the call instead: the inputs go
        to static buffers, the current graph piece ends there, and core runs eagerly at each replay."""
        if self.split is None:
            return core(*inputs, self)
        return self.split(core, out_tail, inputs)


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)). Tensor parallel: attention and MLP end in a row-parallel
    linear, so each returns a partial sum that is all-reduced here (twice per layer, as SGLang). DP
    attention (`parallel.tokens`): attention's sum is over the attention TP group only, and the MLP runs
    over every attention rank's tokens, gathered before it and scattered back after (`mlp_over_ranks`)."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, config: ModelConfig,
                 dtype: torch.dtype, device: torch.device | str, parallel: ModelParallel = SINGLE):
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(hidden, eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype, device)
        attention = parallel.attention_parallel
        self.attn_comm = attention.comm if attention.sharded else None   # None: nothing to reduce
        self.comm = parallel.comm if parallel.sharded else None          # the MLP's (tp=1: None)
        self.tokens = parallel.tokens

    def _reduce_attention(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.attn_comm is None else self.attn_comm.all_reduce(partial)

    def mlp_over_ranks(self, h: torch.Tensor, ops: SmallOps | None = None) -> torch.Tensor:   # [T, H] -> [T, H]
        """The MLP of the normed h, summed over the TP group; under DP attention computed on the tokens
        of every attention rank (this one's may be none: an idle rank still takes its share)."""
        if self.tokens is not None:
            return self.tokens.scatter(self._mlp(self.tokens.gather(h), ops), h.shape[0])
        out = self._mlp(h, ops)
        return out if self.comm is None else self.comm.all_reduce(out)

    def _mlp(self, h: torch.Tensor, ops: SmallOps | None) -> torch.Tensor:
        return self.mlp(h) if ops is None else self.mlp(h, ops)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:   # [T, H] -> [T, H]
        x = x + self._reduce_attention(self.self_attn(self.input_layernorm(x), ctx))
        return x + self.mlp_over_ranks(self.post_attention_layernorm(x))

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None, ctx: StepContext,
                      ops: SmallOps) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer with the residual stream carried separately (as SGLang does): x is the previous
        sublayer's output (the embeddings when residual is None); each add + norm is one fused kernel.
        Returns (mlp output, residual) -- the next layer's (x, residual). Overwrites x and residual."""
        if residual is None:
            residual, h = x, ops.rmsnorm(x, self.input_layernorm)
        else:
            h, residual = ops.add_rmsnorm(x, residual, self.input_layernorm)
        h, residual = ops.add_rmsnorm(self._reduce_attention(self.self_attn(h, ctx)), residual,
                                      self.post_attention_layernorm)
        return self.mlp_over_ranks(h, ops), residual


class DecoderModel(nn.Module):
    """HF's `model.` prefix: embed_tokens (vocab-parallel when attention is sharded), layers, norm."""

    def __init__(self, layers: list[DecoderLayer], config: ModelConfig,
                 dtype: torch.dtype, device: torch.device | str, parallel: ModelParallel = SINGLE):
        super().__init__()
        parallel = parallel.attention_parallel      # DP attention: each attention rank embeds its own tokens
        if parallel.sharded:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype, device, parallel)
        else:
            self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype, device)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)


class CausalLM(nn.Module):
    """Subclasses build one layer in `make_layer` (passing `self.parallel` to its modules) and list HF
    linears merged into one of ours in `stacked_params`: (HF name fragment, our fragment, shard index).
    `parallel` (runtime.distributed.sharding): this rank's share of a tensor-/expert-parallel model; the
    default is the whole model on one device."""

    stacked_params: tuple[tuple[str, str, int], ...] = ()

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                 parallel: ModelParallel = SINGLE):
        super().__init__()
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.parallel = parallel
        layers = [self.make_layer(i) for i in range(config.num_hidden_layers)]
        self.model = DecoderModel(layers, config, dtype, device, parallel)
        head = parallel.attention_parallel    # DP attention: split over the attention TP group (SGLang's dp LM head)
        if head.sharded:
            self.lm_head = vocab_parallel_lm_head(config.hidden_size, config.vocab_size, dtype, device, head)
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype, device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        rot_dim = config.qk_rope_head_dim if config.use_mla else config.head_dim
        self.rotary = RotaryEmbedding(config.rope, rot_dim, config.max_position_embeddings, device)
        self.small_ops: SmallOps | None = None   # fused kernels (fast path on CUDA); None = torch reference

    def make_layer(self, layer_id: int) -> DecoderLayer:
        raise NotImplementedError

    # -- forward -----------------------------------------------------------------------
    @torch.no_grad()
    def hidden_states(self, fb: ForwardBatch, pool: KVPool, split: AttentionSplit | None = None) -> torch.Tensor:
        """Final-normed hidden states of every new token [T, H]; writes this step's KV. `split` (fused
        small ops only): every layer's attention core goes through it (StepContext.run_attention)."""
        backend = fb.attn_backend if fb.attn_backend is not None else TorchAttentionBackend()
        ops = self.small_ops
        if split is not None and ops is None:
            raise ValueError("a split forward (piecewise CUDA graphs) needs the fused small ops")
        if ops is not None:
            return self._hidden_states_fused(fb, pool, backend, ops, split)
        cos, sin = self.rotary.cos_sin(fb.positions)
        ctx = StepContext(fb, pool, backend, cos, sin)
        x = self.model.embed_tokens(fb.input_ids)                # [T, H]
        for layer in self.model.layers:
            x = layer(x, ctx)
        return self.model.norm(x)

    def _hidden_states_fused(self, fb: ForwardBatch, pool: KVPool, backend: AttentionBackend,
                             ops: SmallOps, split: AttentionSplit | None = None) -> torch.Tensor:
        # every family's fused attention rotates q/k from positions through ops.rope (cos/sin table)
        ctx = StepContext(fb, pool, backend, None, None, ops, split)
        x, residual = self.model.embed_tokens(fb.input_ids), None     # [T, H]
        for layer in self.model.layers:
            x, residual = layer.forward_fused(x, residual, ctx, ops)
        if residual is None:
            return ops.rmsnorm(x, self.model.norm)
        return ops.add_rmsnorm(x, residual, self.model.norm)[0]

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:   # [B, H] -> [B, V] float32
        head = self.parallel.attention_parallel
        if head.sharded:   # gathered in the model dtype (half the bytes of float32), then cast
            return gather_logits(self.lm_head(hidden), head).float()
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def idle_step(self) -> None:
        """DP attention: a step in which this attention rank has no tokens while others have some. It
        still computes its share of every layer's MLP over their gathered tokens (its collectives pair
        with theirs, as SGLang's idle batch); nothing is returned."""
        if self.parallel.tokens is None:
            raise RuntimeError("idle_step is for DP attention ranks (the model has no token exchange)")
        h = torch.empty(0, self.config.hidden_size, dtype=self.dtype, device=self.device)   # [0, H]
        for layer in self.model.layers:
            layer.mlp_over_ranks(h, self.small_ops)

    def forward(self, fb: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Logits [B, V] (float32) of each sequence's last new token."""
        return self.compute_logits(self.hidden_states(fb, pool)[fb.logits_indices])

    # -- weights -----------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in (any order, any dtype), check nothing is missing, then derive
        load-time tensors (MLA absorption)."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        loaded: set[tuple[str, object]] = set()
        for name, tensor in weights:
            if self._skip(name):
                continue
            if "weight_scale_inv" in name or tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                raise NotImplementedError(f"{name}: fp8 block-quantised checkpoints are not supported yet")
            loaded.update(self._load_one(name, tensor, params, modules))
        missing = sorted({name for name, _ in self._expected_loads(modules) - loaded})
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
        self.post_load()

    def post_load(self) -> None:
        """Recompute tensors derived from weights (called after any load, dummy included)."""
        for module in self.modules():
            if module is not self and hasattr(module, "post_load"):
                module.post_load()

    def _skip(self, name: str) -> bool:
        layer = _LAYER.match(name)
        return ("rotary_emb." in name
                or (layer is not None and int(layer.group(1)) >= self.config.num_hidden_layers)
                or (name == "lm_head.weight" and self.config.tie_word_embeddings))

    def _load_one(self, name: str, tensor: torch.Tensor, params: dict, modules: dict) -> list[tuple[str, object]]:
        expert = _EXPERT.match(name)
        if expert is not None:
            prefix, index, proj = expert.groups()
            experts: StackedExperts = modules[prefix]
            target = experts.load_hf(proj, None if index is None else int(index), tensor)
            if target is None:  # an expert another rank holds
                return []
            if index is None:   # fused tensor: every expert (and gate+up) at once
                return [(f"{prefix}.{target}", key) for key in _expert_keys(experts, target)]
            return [(f"{prefix}.{target}", (int(index), proj))]
        for hf_frag, our_frag, shard in self.stacked_params:
            if hf_frag in name:
                ours = name.replace(hf_frag, our_frag)
                module: MergedLinear = modules[ours.rsplit(".", 1)[0]]
                spec = shard_spec(params[ours])
                _copy(module.shard(params[ours], shard), spec.narrow_part(tensor, shard) if spec else tensor, name)
                return [(ours, shard)]
        if name not in params:
            raise KeyError(f"checkpoint tensor {name} has no parameter in {type(self).__name__}")
        spec = shard_spec(params[name])
        if spec is not None and tuple(tensor.shape) != spec.full_shape(params[name].shape):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != "
                             f"{spec.full_shape(params[name].shape)} (before sharding)")
        _copy(params[name], spec.narrow(tensor) if spec else tensor, name)
        return [(name, None)]

    def _expected_loads(self, modules: dict) -> set[tuple[str, object]]:
        expected: set[tuple[str, object]] = set()
        for name, param in self.named_parameters():
            owner_name, attr = name.rsplit(".", 1)
            owner = modules[owner_name]
            if isinstance(owner, MergedLinear):
                expected.update((name, i) for i in range(len(owner.out_sizes)))
            elif isinstance(owner, StackedExperts):
                expected.update((name, key) for key in _expert_keys(owner, attr))
            else:
                expected.add((name, None))
        return expected


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} != ours {tuple(dst.shape)}")
    dst.copy_(src)


def _expert_keys(experts: StackedExperts, target: str) -> list[tuple[int, str]]:
    projs = ("gate_proj", "up_proj") if target == "w13" else ("down_proj",)
    return [(e, p) for e in experts.global_ids() for p in projs]
