"""MLA attention (absorbed form) over the paged latent KV cache.

ref.py             torch references: mla_decode_ref, mla_extend_ref
triton_decode.py   Triton split-KV decode (also an extend fallback); no flashinfer needed
flashinfer_mla.py  FlashInferMLA: workspace + BatchMLAPagedAttentionWrapper, plan once per step, run per layer
bench.py           decode timing vs FlashInfer, torch and SGLang's published numbers (CSV)
"""
