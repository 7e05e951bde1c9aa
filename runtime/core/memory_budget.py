"""GPU memory the runtime needs besides weights and the KV pool, bounded from the model and the
scheduler limits: the request->slot table (reserved inside mem_fraction_static, so the KV pool
shrinks by it in both modes) and the activation peak of the largest step the scheduler may plan
(must fit the memory left outside mem_fraction_static, with CUDA graphs).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.core.hardware import HardwareSpec
from runtime.core.layout import LayoutError, ParallelLayout
from runtime.core.model_spec import ModelSpec
from runtime.core.scheduler_config import SchedulerConfig

SLOT_TABLE_EXTRA_ROWS = 8        # the chunked request and finished ones still in flight (overlap)
ACT_BYTES = 2                    # bf16 activations
LIVE_HIDDEN_BUFFERS = 8          # x, residual, normed copies, attention output, MLP in/out
SAMPLER_VOCAB_BUFFERS = 4        # float32 logits, probabilities, noise, filtered copy
CUDA_CONTEXT_BYTES = 1 * 2**30   # CUDA context, cuBLAS/Triton workspaces, FlashInfer buffers
CONTEXT_MAX_SHARE = 0.05         # ... at most this share of a small device's memory


@dataclass(frozen=True)
class RuntimeMemory:
    slot_table_bytes: int
    step_activation_bytes: int
    sampler_bytes: int

    def outside_pool_bytes(self, memory_bytes: int) -> int:
        """What must fit in memory * (1 - mem_fraction_static)."""
        context = min(CUDA_CONTEXT_BYTES, int(CONTEXT_MAX_SHARE * memory_bytes))
        return self.step_activation_bytes + self.sampler_bytes + context


def slot_table_rows(config: SchedulerConfig) -> int:
    return config.max_running_requests + SLOT_TABLE_EXTRA_ROWS


def runtime_memory(model: ModelSpec, layout: ParallelLayout, config: SchedulerConfig,
                   graph_pool_tokens: int = 0) -> RuntimeMemory:
    """Upper bounds per GPU for the largest step: `max(chunked_prefill_size, max_prefill_tokens,
    max_running_requests)` new tokens (mixed steps add decodes to a chunk), `max_running_requests`
    rows of logits. graph_pool_tokens: the largest step captured as piecewise CUDA graphs, whose
    activations stay allocated in the graphs' pool beside the eager attention's (0: none)."""
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else config.max_prefill_tokens
    tokens = max(chunk, config.max_running_requests) + (config.max_running_requests if config.enable_mixed_chunk else 0)
    tp = layout.tp
    hidden = model.hidden_size
    heads = max(1, model.num_attention_heads // layout.attention_tp)
    head_width = (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim + model.kv_lora_rank
                  if model.is_mla else 3 * model.head_dim)
    attention = heads * head_width * 2
    if model.is_moe:
        routed = model.num_experts_per_tok * 3 * max(1, model.moe_intermediate_size // tp)
        shared = 3 * max(0, model.shared_expert_intermediate_size // tp)
        mlp = max(routed + shared, 3 * max(1, model.intermediate_size // tp))
    else:
        mlp = 3 * max(1, model.intermediate_size // tp)
    per_token = (LIVE_HIDDEN_BUFFERS * hidden + attention + mlp) * ACT_BYTES
    rows = slot_table_rows(config)
    table = rows * (model.max_context_tokens + 2) * 4
    sampler = config.max_running_requests * model.vocab_size * 4 * SAMPLER_VOCAB_BUFFERS
    return RuntimeMemory(table, (tokens + min(graph_pool_tokens, tokens)) * per_token, sampler)


def check_fits(memory: RuntimeMemory, hardware: HardwareSpec, mem_fraction_static: float) -> None:
    """One line naming what to lower when the step peak cannot fit beside weights and KV."""
    room = hardware.memory_bytes * (1 - mem_fraction_static)
    need = memory.outside_pool_bytes(hardware.memory_bytes)
    if need > room:
        raise LayoutError(
            f"the largest step needs ~{need / 2**30:.1f} GiB of activations and sampler buffers but only "
            f"{room / 2**30:.1f} GiB of {hardware.name} memory is left outside kv.mem_fraction_static="
            f"{mem_fraction_static}; lower scheduler.chunked_prefill_size, scheduler.max_running_requests "
            "or kv.mem_fraction_static")
