"""Fused small ops of the model forward, each as a torch reference and a Triton kernel.

ref.py             torch references (RMSNorm, add+RMSNorm, SiLU-and-mul, rotary, KV store)
rope_cache.py      cos/sin caches: plain RoPE and DeepSeek YaRN
triton_norm.py     RMSNorm, fused residual-add + RMSNorm (in place or not)
triton_act.py      SiLU-and-mul
triton_gated_act.py  SiLU-and-mul times a per-token sigmoid gate (Qwen2-MoE shared expert)
triton_rope.py     rotary embedding in place, neox or interleaved (GPT-J) style
triton_kv_store.py scatter new rows into KV slots (latent MLA pool or k/v pools)
flashinfer_ops.py  FlashInfer equivalents, imported lazily
bench.py           timing of the above on a GPU
"""
