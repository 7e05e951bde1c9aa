"""MLA attention: the absorbed form over the paged latent KV cache, and the MHA form of prefills.

ref.py                      torch references: mla_decode_ref, mla_extend_ref, mla_mha_prefill_ref
triton_decode.py            Triton split-KV decode (also an extend fallback); no flashinfer needed
flashinfer_mla.py           FlashInferMLA: workspace + BatchMLAPagedAttentionWrapper, plan once per step, run per layer
flashinfer_mha_prefill.py   FlashInferMHAPrefill: ragged causal prefill, Dqk 192 / Dv 128 (MHA form), plan once per step
sdpa_prefill.py             the MHA form without flashinfer: torch SDPA per sequence
triton_concat_k.py          the MHA form's per-head key [k_nope | k_pe] in one streaming copy
bench.py                    decode timing vs FlashInfer, torch and SGLang's published numbers (CSV)
"""
