"""Public figures of the GPUs a run can be projected from and onto: dense tensor-core peak per format and
HBM bandwidth, with sources (read 2026-12-02). BF16/FP8 peaks are quoted with 2:4 sparsity: dense is half.
FP4 is quoted dense (Blackwell Ultra's sparse NVFP4 is not twice it). MXFP8 is taken at the FP8 rate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HGX = "https://www.nvidia.com/en-us/data-center/hgx/"
H100_PAGE = "https://www.nvidia.com/en-us/data-center/h100/"
H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"
GB200_PAGE = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
ULTRA_BLOG = ("https://developer.nvidia.com/blog/inside-nvidia-blackwell-ultra-the-chip-powering-the-ai-factory-era/")
CUBLAS_BLOG = ("https://developer.nvidia.com/blog/"
               "boosting-matrix-multiplication-speed-and-flexibility-with-nvidia-cublas-12-9/")


@dataclass(frozen=True)
class GpuSpec:
    """``peaks``: dense TFLOPS per format; ``bandwidth``: HBM TB/s; ``names``: words of the device name that mean it."""
    key: str
    name: str
    arch: str  # "hopper" or "blackwell"
    peaks: dict[str, float]
    bandwidth: float
    power_w: int | None
    sources: tuple[str, ...]
    names: tuple[str, ...] = field(default=())

    def peak(self, fmt: str) -> float | None:
        return self.peaks.get(fmt)


GPUS: dict[str, GpuSpec] = {g.key: g for g in (
    GpuSpec("H100", "H100 SXM", "hopper", {"bf16": 989.5, "fp8": 1979.0}, 3.35, 700,
            (f"{H100_PAGE} (BF16 1,979 and FP8 3,958 TFLOPS with sparsity; 3.35 TB/s)",),
            ("H100 80GB HBM3", "H100 SXM")),
    GpuSpec("H200", "H200 SXM", "hopper", {"bf16": 989.5, "fp8": 1979.0}, 4.8, 700,
            (f"{H200_PAGE} (SXM: BF16 1,979 and FP8 3,958 TFLOPS with sparsity; 4.8 TB/s)",), ("H200",)),
    GpuSpec("H200NVL", "H200 NVL", "hopper", {"bf16": 835.5, "fp8": 1670.5}, 4.8, 600,
            (f"{H200_PAGE} (NVL: BF16 1,671 and FP8 3,341 TFLOPS with sparsity; 4.8 TB/s)",), ("H200 NVL",)),
    GpuSpec("B200", "B200 (HGX)", "blackwell", {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0}, 8.0, 1000,
            (f"{HGX} (HGX B200, 8 GPUs: FP4 72 PF dense, FP8 72 PF and BF16 36 PF with sparsity; 64 TB/s)",),
            ("B200",)),
    GpuSpec("B300", "B300 (HGX, Blackwell Ultra)", "blackwell", {"bf16": 2250.0, "fp8": 4500.0, "fp4": 13500.0},
            8.0, 1100,
            (f"{HGX} (HGX B300, 8 GPUs: FP4 108 PF dense, FP8 72 PF and BF16 36 PF with sparsity)",
             f"{ULTRA_BLOG} (8 TB/s per GPU)"), ("B300",)),
    GpuSpec("GB200", "GB200 (per GPU, NVL72)", "blackwell", {"bf16": 2500.0, "fp8": 5000.0, "fp4": 10000.0}, 8.0,
            1200, (f"{GB200_PAGE} (72 GPUs: FP4 720 PF dense, FP8 720 PF and BF16 360 PF with sparsity; "
                   "576 TB/s)",), ("GB200",)),
)}

# The most FP4 GEMMs gained over FP8 in NVIDIA's own library on Blackwell (cuBLAS 12.9, CUBLAS_BLOG: "up to
# 2.3x"); B300's FP4 peak is 3x its FP8 one, but a projection credits no more than NVIDIA measured.
FP4_OVER_FP8_MAX = 2.3

# Tensor format each recipe's GEMMs run in.
FORMAT = {"BF16": "bf16", "DelayedScaling": "fp8", "Float8CurrentScaling": "fp8", "Float8BlockScaling": "fp8",
          "MXFP8BlockScaling": "fp8", "NVFP4BlockScaling": "fp4"}


def gpu(key: str) -> GpuSpec:
    """The spec for ``key`` (case and spaces ignored), or a one-line error naming the known ones."""
    k = key.replace(" ", "").upper()
    if k not in GPUS:
        raise ValueError(f"unknown GPU {key!r}: one of {', '.join(GPUS)}")
    return GPUS[k]


def gpu_of_device(device: str) -> GpuSpec | None:
    """The spec whose names match ``device`` as whole words, the longest first ("H200 NVL" is no H200 SXM)."""
    hits = [(len(n), g) for g in GPUS.values() for n in g.names
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])", device or "", re.IGNORECASE)]
    return max(hits, key=lambda h: h[0])[1] if hits else None
