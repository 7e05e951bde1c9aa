"""Per-operator roofline arithmetic for RooflineCostModel: per-GPU coefficients and pricing.

Plain float arithmetic; no torch, no clock. Legend: T = tokens in the step,
S = sequences, L = layers, h = q heads per TP rank, E = routed experts, k = experts per token,
El = E / ep experts one GPU holds.

Expert parallelism is priced as the runtime runs it (SGLang's EP inside the TP group without DeepEP):
every GPU of the group holds every token after attention's all-reduce, computes only the pairs routed
to its El experts (T * k / ep on average, each expert ep times as wide as under pure TP), and the MoE
layer's all-reduce over the tp GPUs is the combine. No all-to-all: nothing is dispatched.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.core.fusion_limits import STACKED_SHARED_MAX_TOKENS, stacks_shared_experts
from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.mla_form import mla_attends_as_mha
from runtime.core.model_spec import ModelSpec
from sim.costmodel.collectives import CollectiveCost

STEP_KERNELS = 5   # embedding, final norm, lm_head, two sampler kernels
# GPU operators of a step, in summation order (decode attention is priced by the model).
GPU_OPS = ("attn_proj", "attn_prefill", "attn_decode", "dense_mlp", "moe_gate", "moe_experts",
           "shared_experts", "lm_head", "elementwise", "sampler", "tp_allreduce", "pp_send",
           "kernel_floor")


def distinct_experts(num_experts: int, top_k: int, num_tokens: float) -> float:
    """Expected number of distinct experts that `num_tokens` tokens, each picking `top_k` of
    `num_experts` uniformly, touch: E * (1 - (1 - k/E)^T). T=1 gives k; T -> inf gives E."""
    if num_experts == 0 or num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def _roof(flops: float, bytes_: float, flops_per_s: float, bytes_per_s: float) -> float:
    return max(flops / flops_per_s, bytes_ / bytes_per_s)


@dataclass(frozen=True)
class LayerCoefficients:
    """Per-GPU sizes and achieved rates, computed once per (model, hardware, layout)."""

    num_layers: int
    num_dense_layers: int
    num_moe_layers: int
    tp: int
    ep: int
    pp: int
    hidden_size: int
    act_dtype_bytes: int
    # achieved rates
    linear_flops_per_s: float      # projections, MLPs and experts in the weight dtype
    bf16_gemm_flops_per_s: float   # lm_head and router gate (never quantized)
    gemm_bytes_per_s: float
    moe_flops_per_s: float
    moe_bytes_per_s: float
    attn_flops_per_s: float
    attn_bytes_per_s: float
    # attention (per layer, per GPU)
    attn_proj_params: float
    attn_proj_bytes: float
    attn_proj_act_bytes_per_token: float
    is_mla: bool
    prefill_flops_per_pair: float      # GQA, or MLA run as MHA (kv_b expands the latent)
    absorbed_flops_per_pair: float     # MLA with W_UK / W_UV absorbed (attends the latent)
    decode_flops_per_ctx: float
    prefill_act_bytes_per_token: float
    absorbed_act_bytes_per_token: float
    decode_act_bytes_per_req: float
    mla_expand_params: float            # kv_b_proj: a prefix attended in MHA form is expanded through it
    mla_expand_act_bytes_per_token: float
    kv_bytes_per_token_layer: float
    # MLPs (per layer, per GPU)
    dense_mlp_params: float
    dense_mlp_bytes: float
    dense_mlp_act_bytes_per_token: float
    router_params: float
    router_bytes: float
    num_experts: int
    top_k: int
    routed_bytes_all_experts: float    # this GPU's El experts (E/ep experts, I*ep/tp wide)
    routed_flops_per_token: float      # this GPU's k/ep pairs of a token, on average
    moe_act_bytes_per_token: float
    shared_params: float
    shared_bytes: float
    shared_act_bytes_per_token: float
    shared_stacked_max_tokens: int     # steps of up to this many tokens run the shared experts in the grouped GEMMs
    # once per step
    lm_head_params: float
    lm_head_bytes: float
    logits_bytes_per_seq: float
    elementwise_bytes_per_token_layer: float
    norm_bytes_per_layer: float
    num_kernels: int
    kernel_floor_s: float
    eager_kernel_gap_s: float
    sampler_base_s: float
    sampler_per_seq_s: float

    @classmethod
    def build(cls, model: ModelSpec, hw: HardwareSpec, layout: ParallelLayout, *, mfu: float,
              mbu: float, attention_mfu: float, attention_mbu: float, moe_efficiency: float,
              kernels_per_layer: int | None, moe_mfu: float | None = None,
              moe_mbu: float | None = None, fp8_mfu_scale: float = 1.0,
              kernel_floor_s: float, eager_kernel_gap_s: float, sampler_base_s: float,
              sampler_per_seq_s: float,
              elementwise_passes: int, kv_dtype_bytes: int,
              act_dtype_bytes: int) -> "LayerCoefficients":
        tp, ab = layout.tp, act_dtype_bytes
        H, heads = model.hidden_size, model.num_attention_heads // tp
        moe_ids = model.moe_layer_ids
        dense_ids = [i for i in range(model.num_layers) if i not in moe_ids]
        moe_p = model.layer_params_by_part(moe_ids[0], tp) if moe_ids else None
        moe_b = model.layer_weight_bytes_by_part(moe_ids[0], tp) if moe_ids else None
        any_p = model.layer_params_by_part(0, tp)
        any_b = model.layer_weight_bytes_by_part(0, tp)
        dense_p = model.layer_params_by_part(dense_ids[0], tp) if dense_ids else any_p
        dense_b = model.layer_weight_bytes_by_part(dense_ids[0], tp) if dense_ids else any_b
        small_dtype = "float32" if model.weight_dtype == "float32" else "bfloat16"
        kv_layer = model.kv_bytes_per_token_per_layer(kv_dtype_bytes, tp)
        attn = _attention_shapes(model, tp, ab, kv_layer)
        moe_width = model.moe_intermediate_size * layout.ep / tp   # one expert slice per GPU (I * ep / tp)
        shared_width = model.shared_expert_intermediate_size / tp
        k = model.num_experts_per_tok
        # fp8 weights: GEMMs reach fp8_mfu_scale of their bf16 efficiency against the fp8 peak
        dtype_scale = fp8_mfu_scale if model.weight_dtype == "float8" else 1.0
        linear = hw.peak_flops(model.weight_dtype) * mfu * dtype_scale
        # fused MoE: its own efficiencies when given, else moe_efficiency times the dense ones
        moe_flops = (linear * moe_efficiency if moe_mfu is None
                     else hw.peak_flops(model.weight_dtype) * moe_mfu * dtype_scale)
        moe_bytes = (hw.hbm_bandwidth_bytes_per_s * mbu * moe_efficiency if moe_mbu is None
                     else hw.hbm_bandwidth_bytes_per_s * moe_mbu)
        return cls(
            num_layers=model.num_layers, num_dense_layers=len(dense_ids),
            num_moe_layers=len(moe_ids), tp=tp, ep=layout.ep, pp=layout.pp, hidden_size=H,
            act_dtype_bytes=ab, linear_flops_per_s=linear,
            bf16_gemm_flops_per_s=hw.peak_flops(small_dtype) * mfu,
            gemm_bytes_per_s=hw.hbm_bandwidth_bytes_per_s * mbu,
            moe_flops_per_s=moe_flops, moe_bytes_per_s=moe_bytes,
            attn_flops_per_s=hw.peak_flops(small_dtype) * attention_mfu,
            attn_bytes_per_s=hw.hbm_bandwidth_bytes_per_s * attention_mbu,
            attn_proj_params=any_p["attention"], attn_proj_bytes=any_b["attention"],
            attn_proj_act_bytes_per_token=(2 * H + 2 * heads * attn["width"]) * ab,
            is_mla=model.is_mla, kv_bytes_per_token_layer=kv_layer, **attn["per_pair"],
            dense_mlp_params=dense_p["dense_mlp"], dense_mlp_bytes=dense_b["dense_mlp"],
            dense_mlp_act_bytes_per_token=(2 * H + 3 * model.intermediate_size / tp) * ab,
            router_params=moe_p["router"] if moe_p else 0,
            router_bytes=moe_b["router"] if moe_b else 0,
            num_experts=model.num_experts, top_k=k,
            routed_bytes_all_experts=moe_b["routed_experts"] if moe_b else 0,
            # k/ep own pairs per token x 2*3*H*moe_width FLOPs each = 2*k*3*H*I/tp at any ep
            routed_flops_per_token=2 * k * 3 * H * model.moe_intermediate_size / tp,
            moe_act_bytes_per_token=k / layout.ep * (2 * H + 3 * moe_width) * ab,
            shared_params=moe_p["shared_experts"] if moe_p else 0,
            shared_bytes=moe_b["shared_experts"] if moe_b else 0,
            shared_act_bytes_per_token=(2 * H + 3 * shared_width) * ab,
            shared_stacked_max_tokens=STACKED_SHARED_MAX_TOKENS if stacks_shared_experts(layout.tp, layout.ep) else 0,
            lm_head_params=model.vocab_size * H / tp,
            lm_head_bytes=model.vocab_size * H / tp * model.bytes_per_param("lm_head"),
            logits_bytes_per_seq=model.vocab_size / tp * 4,
            elementwise_bytes_per_token_layer=elementwise_passes * H * ab,
            norm_bytes_per_layer=any_b["norms_and_biases"],
            num_kernels=_count_kernels(model, layout, kernels_per_layer),
            kernel_floor_s=kernel_floor_s, eager_kernel_gap_s=eager_kernel_gap_s,
            sampler_base_s=sampler_base_s,
            sampler_per_seq_s=sampler_per_seq_s)


def _attention_shapes(model: ModelSpec, tp: int, ab: int, kv_layer: int) -> dict:
    """FLOPs per (query, key) pair and activation bytes per query, one layer, one TP rank."""
    h = model.num_attention_heads // tp
    if not model.is_mla:
        d = model.head_dim
        act = 2 * h * d * ab + kv_layer                               # q in, o out, KV write
        per_pair = dict(prefill_flops_per_pair=4 * h * d, absorbed_flops_per_pair=4 * h * d,
                        decode_flops_per_ctx=4 * h * d, prefill_act_bytes_per_token=act,
                        absorbed_act_bytes_per_token=act, decode_act_bytes_per_req=act,
                        mla_expand_params=0.0, mla_expand_act_bytes_per_token=0.0)
        return {"width": d, "per_pair": per_pair}
    qk, v = model.head_dim, model.v_head_dim
    latent, rank = model.kv_lora_rank + model.qk_rope_head_dim, model.kv_lora_rank
    absorbed_act = h * (latent + rank) * ab + kv_layer                # q, o in latent space
    per_pair = dict(prefill_flops_per_pair=2 * h * (qk + v),
                    absorbed_flops_per_pair=2 * h * (latent + rank),
                    decode_flops_per_ctx=2 * h * (latent + rank),
                    prefill_act_bytes_per_token=h * (2 * qk + 2 * v) * ab + kv_layer,
                    absorbed_act_bytes_per_token=absorbed_act,
                    decode_act_bytes_per_req=absorbed_act,
                    mla_expand_params=h * (model.qk_nope_head_dim + v) * rank,
                    # latent gathered from the pool, expanded k and v written, then read by attention
                    mla_expand_act_bytes_per_token=kv_layer + 2 * h * (qk + v) * ab)
    return {"width": qk + v, "per_pair": per_pair}


def _count_kernels(model: ModelSpec, layout: ParallelLayout, per_layer: int | None) -> int:
    """Kernels of one forward step, as SGLang launches them per layer kind."""
    if per_layer is not None:
        return model.num_layers * per_layer + STEP_KERNELS
    collective = 1 if layout.tp > 1 else 0
    total = STEP_KERNELS
    for i in range(model.num_layers):
        total += 10 if model.is_mla else 7          # norms, projections (MLA: q and kv_a in one), rope, cache, attention
        total += collective
        if not model.is_moe_layer(i):
            total += 3 + collective                   # gate_up, act, down
            continue
        total += 7                                    # gate, topk, align, 2 grouped GEMMs, act, sum
        # shared experts: on one rank stacked into the grouped GEMMs (the runtime's decode steps; SGLang's
        # shared-experts fusion), the gate of Qwen2-MoE's one more router row; else their own MLP
        if not stacks_shared_experts(layout.tp, layout.ep):
            total += 3 if model.shared_expert_intermediate_size else 0
            total += 1 if model.architecture == "qwen2_moe" else 0
        total += collective                           # the all-reduce (with ep: the combine)
        total += 1 if layout.ep > 1 else 0            # ep: other ranks' experts' ids -> -1
    return total


# kernels of one layer's attention core that a piecewise-graph step launches eagerly between its graph
# pieces (runtime.models: KV store, latent gather / kv_b expansion or absorption bmms, attention, output copy)
PIECEWISE_EAGER_KERNELS_PER_LAYER = 5


@dataclass
class FixedTerms:
    """A step's costs that do not depend on decode context lengths. piecewise: the step replays
    per-layer graph pieces (num_layers + 1 graph launches) around eagerly launched attention cores."""

    gpu_s: dict[str, float]
    gpu_sum_s: float
    num_tokens: int
    use_graph: bool = False
    cpu_s: float = 0.0
    num_seqs: int = 0
    piecewise: bool = False


def price_fixed_terms(c: LayerCoefficients, extend_new: tuple[int, ...],
                      extend_prefix: tuple[int, ...], num_decode: int,
                      use_graph: bool, collectives: CollectiveCost,
                      padded_tokens: int | None = None) -> FixedTerms:
    """All GPU operator times of a step except decode attention (set to 0 here). Without a
    CUDA graph every kernel also waits `eager_kernel_gap_s` for its launch to reach the GPU,
    and every collective pays its eager latency. padded_tokens (a piecewise-graph step): the graph
    pieces -- everything but attention, the LM head and the sampler -- run over this many tokens,
    and only the attention cores' kernels wait for eager launches."""
    t_ext = sum(extend_new)
    T, S = t_ext + num_decode, len(extend_new) + num_decode
    gpu = dict.fromkeys(GPU_OPS, 0.0)
    if T == 0:
        return FixedTerms(gpu, 0.0, 0, use_graph)
    piecewise = padded_tokens is not None
    num_real = T
    T = padded_tokens if piecewise else T
    L, Ld, Lm = c.num_layers, c.num_dense_layers, c.num_moe_layers
    H, ab = c.hidden_size, c.act_dtype_bytes
    gpu["attn_proj"] = L * _roof(2 * T * c.attn_proj_params,
                                 c.attn_proj_bytes + T * c.attn_proj_act_bytes_per_token,
                                 c.linear_flops_per_s, c.gemm_bytes_per_s)
    gpu["attn_prefill"] = L * _extend_attention_s(c, extend_new, extend_prefix)
    gpu["dense_mlp"] = Ld * _roof(2 * T * c.dense_mlp_params,
                                  c.dense_mlp_bytes + T * c.dense_mlp_act_bytes_per_token,
                                  c.linear_flops_per_s, c.gemm_bytes_per_s)
    if Lm:
        gpu["moe_gate"] = Lm * _roof(2 * T * c.router_params, c.router_bytes + T * H * ab,
                                     c.bf16_gemm_flops_per_s, c.gemm_bytes_per_s)
        gpu["moe_experts"] = Lm * moe_experts_s(c, T)
        stacked = T <= c.shared_stacked_max_tokens      # one rank: the runtime's stacked shared experts
        gpu["shared_experts"] = Lm * _roof(2 * T * c.shared_params,
                                           c.shared_bytes + T * c.shared_act_bytes_per_token,
                                           c.moe_flops_per_s if stacked else c.linear_flops_per_s,
                                           c.moe_bytes_per_s if stacked else c.gemm_bytes_per_s)
    gpu["lm_head"] = lm_head_s(c, S)
    elementwise_bytes = L * (T * c.elementwise_bytes_per_token_layer + c.norm_bytes_per_layer)
    gpu["elementwise"] = (elementwise_bytes + T * H * ab) / c.gemm_bytes_per_s   # + embedding
    gpu["sampler"] = c.sampler_base_s + c.sampler_per_seq_s * S
    _price_communication(c, gpu, T, collectives, use_graph or piecewise)
    eager_kernels = 0 if use_graph else (L * PIECEWISE_EAGER_KERNELS_PER_LAYER if piecewise else c.num_kernels)
    gpu["kernel_floor"] = c.num_kernels * c.kernel_floor_s + eager_kernels * c.eager_kernel_gap_s
    return FixedTerms(gpu, sum(gpu[op] for op in GPU_OPS), num_real, use_graph, num_seqs=S, piecewise=piecewise)


def moe_experts_s(c: LayerCoefficients, num_tokens: int) -> float:
    """The fused-MoE grouped GEMMs of one MoE layer over `num_tokens` tokens on one GPU: its own pairs
    (T * k / ep) and, routing uniform, the bytes of its El experts that they touch (an expert is
    touched with probability 1 - (1 - k/E)^T, so the fraction does not depend on ep)."""
    touched = distinct_experts(c.num_experts, c.top_k, num_tokens) / c.num_experts
    return _roof(num_tokens * c.routed_flops_per_token,
                 touched * c.routed_bytes_all_experts + num_tokens * c.moe_act_bytes_per_token,
                 c.moe_flops_per_s, c.moe_bytes_per_s)


def lm_head_s(c: LayerCoefficients, num_seqs: int) -> float:
    """The LM head over one row per sequence, fp32 logits written."""
    return _roof(2 * num_seqs * c.lm_head_params, c.lm_head_bytes + num_seqs * c.logits_bytes_per_seq,
                 c.bf16_gemm_flops_per_s, c.gemm_bytes_per_s)


def _extend_attention_s(c: LayerCoefficients, extend_new: tuple[int, ...],
                        extend_prefix: tuple[int, ...]) -> float:
    """Causal attention of new tokens over prefix + new, one layer. MLA runs in the form SGLang picks
    per batch (runtime.core.mla_form, the rule the runtime runs): MHA when no item has a cached prefix,
    or when the summed prefix reaches the threshold -- then the prefix latents are expanded through
    kv_b_proj too -- else absorbed over the latent. (In a mixed-chunk step the runtime also counts the
    decodes' contexts as prefix; this prices the extends by their own prefixes, decodes as absorbed.)"""
    if not extend_new:
        return 0.0
    pairs = sum(n * (n + 1) / 2 + n * p for n, p in zip(extend_new, extend_prefix))
    kv_tokens = sum(extend_new) + sum(extend_prefix)
    mha = not c.is_mla or mla_attends_as_mha(extend_prefix, [n + p for n, p in zip(extend_new, extend_prefix)])
    flops = pairs * (c.prefill_flops_per_pair if mha else c.absorbed_flops_per_pair)
    act = c.prefill_act_bytes_per_token if mha else c.absorbed_act_bytes_per_token
    bytes_ = kv_tokens * c.kv_bytes_per_token_layer + sum(extend_new) * act
    attention_s = _roof(flops, bytes_, c.attn_flops_per_s, c.attn_bytes_per_s)
    prefix = sum(extend_prefix)
    if not (c.is_mla and mha and prefix):
        return attention_s
    expand_s = _roof(2 * prefix * c.mla_expand_params, prefix * c.mla_expand_act_bytes_per_token,
                     c.linear_flops_per_s, c.gemm_bytes_per_s)
    return attention_s + expand_s


def _price_communication(c: LayerCoefficients, gpu: dict[str, float], T: int,
                         collectives: CollectiveCost, graph: bool) -> None:
    """TP all-reduce of the T x H activations after attention and after each MLP (dense or MoE), over
    tp GPUs; with ep > 1 the MoE layer's all-reduce is also the experts' combine (ep divides tp, so
    the EP group lies inside the TP group). pp > 1 sends T x H between consecutive stages."""
    H, ab = c.hidden_size, c.act_dtype_bytes
    cost = collectives.time_s
    if c.tp > 1:
        count = c.num_layers + c.num_dense_layers + c.num_moe_layers
        gpu["tp_allreduce"] = count * cost("all_reduce", T * H * ab, c.tp, graph)
    if c.pp > 1:
        gpu["pp_send"] = (c.pp - 1) * cost("send_recv", T * H * ab, 2, graph)
