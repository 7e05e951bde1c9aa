"""Parallel layout (tp/ep/dp/pp), its validation against a model, and THE KV-capacity function.

Must not import torch, simpy or time (runtime/core). Both modes size their KV pool with
`kv_capacity_tokens`, so the simulator and the GPU runtime admit the same requests.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.core.hardware import HardwareSpec
from runtime.core.model_spec import ModelSpec

GB = 1e9


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class LayoutError(ValueError):
    """A layout that cannot run this model on this hardware; the message is one line naming the
    numbers and the valid choices (run.py prints it without a traceback)."""


@dataclass(frozen=True)
class ParallelLayout:
    """SGLang semantics. One DP replica is pp pipeline stages of tp GPUs each, so
    num_gpus = tp * pp * dp; replicas share nothing and each has its own scheduler and KV pool.

    ep shards routed experts inside a TP group: ep must divide tp; each GPU holds
    num_experts / ep whole experts, each split tp / ep ways along the intermediate dim.
    SGLang's EP MoE is ep == tp (whole experts per GPU); ep == 1 is plain TP MoE. Either way a
    GPU holds 1/tp of the routed expert weights; ep changes the communication (all-to-all).

    dp_attention (SGLang --enable-dp-attention): the dp ranks live inside the tp GPUs instead
    of beside them: num_gpus = tp * pp, each of the dp attention ranks owns its requests, its
    scheduler and its KV, with attention heads split attention_tp = tp / dp ways, while the
    MLP/MoE layers run over all tp GPUs on the tokens gathered from every attention rank.
    """

    tp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    dp_attention: bool = False

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    @property
    def attention_tp(self) -> int:
        """GPUs one attention head group is split over (tp, or tp / dp with dp_attention)."""
        return self.tp // self.dp if self.dp_attention else self.tp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    def validate(self, model: ModelSpec) -> None:
        """Raise LayoutError naming the bad degree, the model dimension and the valid choices."""
        for key in ("tp", "ep", "dp", "pp"):
            if getattr(self, key) < 1:
                raise LayoutError(f"{key} must be >= 1, got {key}={getattr(self, key)}")
        problem = tp_problem(model, self.tp)
        if problem:
            valid = ", ".join(map(str, valid_tp_sizes(model)))
            raise LayoutError(f"tp={self.tp} {problem} of {model.name}; valid tp: {valid}")
        if self.ep > 1:
            self._validate_ep(model)
        if self.pp > model.num_layers:
            raise LayoutError(f"pp={self.pp} exceeds num_layers={model.num_layers} of {model.name} "
                              f"(a pipeline stage needs a layer); valid pp: 1 to {model.num_layers}")
        if self.dp_attention:
            self._validate_dp_attention(model)

    def _validate_dp_attention(self, model: ModelSpec) -> None:
        valid = [d for d in _divisors(self.tp) if tp_problem(model, self.tp // d) is None]
        choices = ", ".join(map(str, valid))
        if self.tp % self.dp:
            raise LayoutError(f"dp={self.dp} does not divide tp={self.tp} (dp_attention splits the "
                              f"tp GPUs into dp attention ranks) for {model.name}; valid dp: {choices}")
        problem = tp_problem(model, self.attention_tp)
        if problem:
            raise LayoutError(f"attention tp = tp/dp = {self.attention_tp} {problem} of "
                              f"{model.name}; valid dp with tp={self.tp}: {choices}")

    def _validate_ep(self, model: ModelSpec) -> None:
        if not model.is_moe:
            raise LayoutError(f"ep={self.ep} needs a MoE model; {model.name} is dense (use ep=1)")
        valid = [e for e in _divisors(self.tp) if model.num_experts % e == 0
                 and model.moe_intermediate_size % (self.tp // e) == 0]
        choices = ", ".join(map(str, valid))
        if self.tp % self.ep:
            raise LayoutError(f"ep={self.ep} must divide tp={self.tp} (experts are sharded inside "
                             f"the TP group) for {model.name}; valid ep: {choices}")
        if model.num_experts % self.ep:
            raise LayoutError(f"ep={self.ep} does not divide num_experts={model.num_experts} of "
                             f"{model.name}; valid ep with tp={self.tp}: {choices}")
        if model.moe_intermediate_size % (self.tp // self.ep):
            raise LayoutError(f"tp/ep={self.tp // self.ep} does not divide moe_intermediate_size="
                             f"{model.moe_intermediate_size} of {model.name}; valid ep: {choices}")


def tp_problem(model: ModelSpec, tp: int) -> str | None:
    """Why `tp` cannot shard `model` (a phrase ending in a model dimension), or None."""
    if model.num_attention_heads % tp:
        return f"does not divide num_attention_heads={model.num_attention_heads}"
    kv = model.num_kv_heads
    if not model.is_mla and kv % tp and tp % kv:
        return f"neither divides nor is a multiple of num_key_value_heads={kv}"
    if len(model.moe_layer_ids) < model.num_layers and model.intermediate_size % tp:
        return f"does not divide intermediate_size={model.intermediate_size}"
    if model.is_moe and model.shared_expert_intermediate_size % tp:
        shared = model.shared_expert_intermediate_size
        return f"does not divide shared_expert_intermediate_size={shared}"
    return None


def valid_tp_sizes(model: ModelSpec) -> list[int]:
    return [tp for tp in _divisors(model.num_attention_heads) if tp_problem(model, tp) is None]


def kv_capacity_tokens(model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                       kv_dtype_bytes: int = 2, mem_fraction_static: float = 0.88,
                       activation_reserve_bytes: int = 0) -> int:
    """Tokens of KV one DP replica (with dp_attention: one attention rank) can hold; every GPU
    of the replica holds its share of each token.

    Per GPU, as SGLang: memory * mem_fraction_static is for weights plus KV pool (the rest is
    left to activations and CUDA graphs); `activation_reserve_bytes` holds back more (CUDA
    context, NCCL buffers). KV per token per GPU: that layer's bytes on one attention TP rank
    times the layers of one pipeline stage. Raises LayoutError when the weights leave no room.
    """
    layout.validate(model)
    if not 0 < mem_fraction_static <= 1:
        raise LayoutError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static}")
    budget_bytes = hardware.memory_bytes * mem_fraction_static - activation_reserve_bytes
    weight_bytes = weight_bytes_per_gpu(model, layout)
    layers_per_gpu = -(-model.num_layers // layout.pp)     # the fullest stage (SGLang splits unevenly)
    kv_layer_bytes = model.kv_bytes_per_token_per_layer(kv_dtype_bytes, layout.attention_tp)
    kv_per_token_bytes = kv_layer_bytes * layers_per_gpu
    tokens = int((budget_bytes - weight_bytes) // kv_per_token_bytes)
    if tokens < 1:
        raise LayoutError(_no_room_message(model, hardware, layout, mem_fraction_static,
                                           budget_bytes, weight_bytes))
    return tokens


def weight_bytes_per_gpu(model: ModelSpec, layout: ParallelLayout) -> int:
    """Weight bytes on the fullest GPU. With dp_attention the attention weights, the embedding and
    the LM head are split only attention_tp ways (replicated across the dp attention ranks, which
    embed and sample their own tokens), the rest tp ways."""
    base = model.weight_bytes_per_gpu(layout)
    if layout.attention_tp == layout.tp:
        return base
    narrow = model.layer_weight_bytes_by_part(0, layout.attention_tp)
    wide = model.layer_weight_bytes_by_part(0, layout.tp)
    extra_per_layer = sum(narrow[p] - wide[p] for p in ("attention", "norms_and_biases"))
    layers_per_stage = -(-model.num_layers // layout.pp)
    vocab_bytes = (model.embedding_params() * model.bytes_per_param("embedding")
                   + model.lm_head_params() * model.bytes_per_param("lm_head"))
    extra_vocab = vocab_bytes * (1 / layout.attention_tp - 1 / layout.tp)
    return int(base + layers_per_stage * extra_per_layer + extra_vocab)


def _no_room_message(model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                     fraction: float, budget_bytes: float, weight_bytes: int) -> str:
    msg = (f"{model.name} weights ({model.weight_dtype}) need {weight_bytes / GB:.1f} GB per GPU "
           f"with tp={layout.tp}, pp={layout.pp}, but {hardware.name} leaves "
           f"{budget_bytes / GB:.1f} GB for weights and KV (mem_fraction_static={fraction} of "
           f"{hardware.memory_bytes / GB:.1f} GB)")
    for tp in valid_tp_sizes(model):
        bigger = ParallelLayout(tp=tp, pp=layout.pp)
        if tp > layout.tp and model.weight_bytes_per_gpu(bigger) < 0.9 * budget_bytes:
            return msg + f"; try tp={tp} ({model.weight_bytes_per_gpu(bigger) / GB:.1f} GB per GPU)"
    return msg + "; no tensor-parallel size fits: add pipeline stages (pp) or quantize"
