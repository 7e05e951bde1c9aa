"""Grouped-query (and plain multi-head) attention over the paged MHA KV pool, page size 1.

ref.py             torch reference: gqa_attention_ref (extend with a cached prefix; decode is q_len 1)
triton_attention.py  Triton flash-attention over paged KV (extend and decode); the fallback without flashinfer
flashinfer_gqa.py  FlashInferGQA: workspace + paged prefill / decode wrappers, plan once per step, run per layer;
                   a CUDA-graph mode with fixed index buffers for decode
bench.py           decode and prefill timings: FlashInfer, Triton, torch reference (CSV)
"""
