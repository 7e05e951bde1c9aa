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


@dataclass(frozen=True)
class ParallelLayout:
    """SGLang semantics. One DP replica is pp pipeline stages of tp GPUs each, so
    num_gpus = tp * pp * dp; replicas share nothing and each has its own scheduler and KV pool.

    ep shards routed experts inside a TP group: ep must divide tp; each GPU holds
    num_experts / ep whole experts, each split tp / ep ways along the intermediate dim.
    SGLang's EP MoE is ep == tp (whole experts per GPU); ep == 1 is plain TP MoE. Either way a
    GPU holds 1/tp of the routed expert weights; ep changes the communication (all-to-all).
    """

    tp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    def validate(self, model: ModelSpec) -> None:
        """Raise ValueError naming the bad degree, the model dimension and the valid choices."""
        for key in ("tp", "ep", "dp", "pp"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {key}={getattr(self, key)}")
        problem = tp_problem(model, self.tp)
        if problem:
            valid = ", ".join(map(str, valid_tp_sizes(model)))
            raise ValueError(f"tp={self.tp} {problem} of {model.name}; valid tp: {valid}")
        if self.ep > 1:
            self._validate_ep(model)
        if model.num_layers % self.pp:
            valid = ", ".join(map(str, _divisors(model.num_layers)))
            raise ValueError(f"pp={self.pp} does not divide num_layers={model.num_layers} of "
                             f"{model.name}; valid pp: {valid}")

    def _validate_ep(self, model: ModelSpec) -> None:
        if not model.is_moe:
            raise ValueError(f"ep={self.ep} needs a MoE model; {model.name} is dense (use ep=1)")
        valid = [e for e in _divisors(self.tp) if model.num_experts % e == 0
                 and model.moe_intermediate_size % (self.tp // e) == 0]
        choices = ", ".join(map(str, valid))
        if self.tp % self.ep:
            raise ValueError(f"ep={self.ep} must divide tp={self.tp} (experts are sharded inside "
                             f"the TP group) for {model.name}; valid ep: {choices}")
        if model.num_experts % self.ep:
            raise ValueError(f"ep={self.ep} does not divide num_experts={model.num_experts} of "
                             f"{model.name}; valid ep with tp={self.tp}: {choices}")
        if model.moe_intermediate_size % (self.tp // self.ep):
            raise ValueError(f"tp/ep={self.tp // self.ep} does not divide moe_intermediate_size="
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
    """Tokens of KV one DP replica can hold (every GPU of the replica holds its share of each).

    Per GPU, as SGLang: memory * mem_fraction_static is for weights plus KV pool (the rest is
    left to activations and CUDA graphs); `activation_reserve_bytes` holds back more (CUDA
    context, NCCL buffers). KV per token per GPU: that layer's bytes on one TP rank times the
    layers of one pipeline stage. Raises ValueError when the weights leave no room.
    """
    layout.validate(model)
    if not 0 < mem_fraction_static <= 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static}")
    budget_bytes = hardware.memory_bytes * mem_fraction_static - activation_reserve_bytes
    weight_bytes = model.weight_bytes_per_gpu(layout)
    layers_per_gpu = model.num_layers // layout.pp
    kv_layer_bytes = model.kv_bytes_per_token_per_layer(kv_dtype_bytes, layout.tp)
    kv_per_token_bytes = kv_layer_bytes * layers_per_gpu
    tokens = int((budget_bytes - weight_bytes) // kv_per_token_bytes)
    if tokens < 1:
        raise ValueError(_no_room_message(model, hardware, layout, mem_fraction_static,
                                          budget_bytes, weight_bytes))
    return tokens


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
