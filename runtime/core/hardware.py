"""One GPU's capacities: memory, HBM bandwidth, peak matrix rates, interconnect, launch costs.

Must not import torch, simpy or time (runtime/core). Values come from conf/hardware/*.yaml,
whose comments say which numbers were measured and which are datasheet or typical values.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareSpec:
    """Per-GPU numbers. Bandwidths are what a device-to-device copy achieves (bytes read plus
    written per second), not the datasheet peak, wherever a measurement exists.

    - memory_bytes: total device memory as the driver reports it (nvidia-smi's MiB * 2**20);
    - nvlink_bandwidth_bytes_per_s: one GPU's NVLink bandwidth in one direction;
    - kernel_launch_s: host cost of launching one kernel eagerly (PyTorch dispatch included);
    - cuda_graph_launch_s: host cost of replaying one captured CUDA graph;
    - num_sms: streaming multiprocessors (attention kernels split a step's work over them).
    """

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    peak_bf16_flops: float
    peak_fp8_flops: float
    nvlink_bandwidth_bytes_per_s: float
    num_gpus_per_node: int = 8
    kernel_launch_s: float = 8e-6
    cuda_graph_launch_s: float = 30e-6
    num_sms: int = 0                  # 0: not known (attention's work split over the SMs not priced)

    def __post_init__(self) -> None:
        for key in ("memory_bytes", "hbm_bandwidth_bytes_per_s", "peak_bf16_flops",
                    "peak_fp8_flops", "nvlink_bandwidth_bytes_per_s", "num_gpus_per_node"):
            if getattr(self, key) <= 0:
                raise ValueError(
                    f"hardware {self.name}: {key} must be > 0, got {getattr(self, key)}")
        if self.kernel_launch_s < 0 or self.cuda_graph_launch_s < 0:
            raise ValueError(f"hardware {self.name}: launch costs must be >= 0")
        if self.num_sms < 0:
            raise ValueError(f"hardware {self.name}: num_sms must be >= 0, got {self.num_sms}")

    def peak_flops(self, dtype: str) -> float:
        """Dense matrix FLOP/s for operands of `dtype` (float32 runs as TF32: half of bf16)."""
        if dtype == "float8":
            return self.peak_fp8_flops
        if dtype == "float32":
            return self.peak_bf16_flops / 2
        return self.peak_bf16_flops
