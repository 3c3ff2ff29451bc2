"""The memory traffic a recipe's quantization adds to a GEMM: bytes read and written per element
of each operand it quantizes, and which operands each pass quantizes.

Per element of a BF16 operand (2 bytes read per pass over it), by recipe (TE 2.20 recipes,
transformer_engine/common/recipe/__init__.py; docs/features/low_precision_training):

- DelayedScaling: one cast pass (the scale comes from the amax history) writing FP8 data: 1 byte
  per copy.
- Float8CurrentScaling: an amax pass first (the scale is this tensor's own), then the cast: 1 byte
  per copy.
- Float8BlockScaling: one pass, scales computed in it: 1 byte per copy plus an FP32 scale per
  128 elements (1x128 blocks; weights 128x128, whose scales are negligible).
- MXFP8BlockScaling: one pass, an E8M0 scale per 32 elements: 1 + 1/32 bytes per copy (1x32
  rowwise and 32x1 columnwise blocks, both computed from the BF16 input).
- NVFP4BlockScaling: an amax pass (the per-tensor FP32 second-level scale) and the cast: 4-bit data
  and an E4M3 scale per 16 elements, 1/2 + 1/16 bytes per copy; the columnwise copy of an input and
  of a gradient (the wgrad operands) goes through the random Hadamard transform, with its own
  amax after it (``with_post_rht_amax``): one more pass over the operand. Weights use 16x16 blocks
  (2D), no RHT.

Copies: a tensor used by two GEMMs in different layouts gets a rowwise and a columnwise copy (two
writes). Which operands each pass quantizes depends on the schedule:

- ``training`` (what a training step pays, and what ``te-gemm bench``'s autocast mode times):
  fprop quantizes its input X (M x K) and weight W (N x K), each with both copies (X is reused by
  wgrad, W by dgrad); dgrad quantizes the output gradient dY (M x N), both copies (reused by
  wgrad); wgrad quantizes nothing.
- ``te_benchmark`` (TE's benchmarks/gemm/benchmark_gemm.py autocast mode: every pass is timed as a
  forward te.Linear on its shape): each timed call quantizes its input with both copies and its
  weight rowwise only.
"""

from __future__ import annotations

from te_gemm_callback.shapes import GemmOp, GemmShape

SCHEDULES = ("training", "te_benchmark")

# Bytes written per element per copy (data + block scales).
COPY_BYTES = {"DelayedScaling": 1.0, "Float8CurrentScaling": 1.0, "Float8BlockScaling": 1.0 + 4 / 128,
              "MXFP8BlockScaling": 1.0 + 1 / 32, "NVFP4BlockScaling": 0.5 + 1 / 16}
# Passes that only read the operand for its amax, before the cast.
AMAX_PASSES = {"DelayedScaling": 0, "Float8CurrentScaling": 1, "Float8BlockScaling": 0, "MXFP8BlockScaling": 0,
               "NVFP4BlockScaling": 1}
BF16_BYTES = 2.0


def operand_bytes(recipe: str, elements: float, copies: int, rht: bool = False) -> float:
    """Bytes moved to quantize one BF16 operand of ``elements`` values into ``copies`` copies:
    amax reads, the cast's read, its writes; an RHT'd NVFP4 operand reads once more (post-RHT amax).

    Example:
        >>> operand_bytes("Float8CurrentScaling", 1000, 2)   # amax read, cast read, two 1-byte copies
        6000.0
        >>> operand_bytes("NVFP4BlockScaling", 1600, 2, rht=True)  # 2 + 2 + 2 reads, 2 x (0.5 + 1/16)
        11400.0
    """
    if recipe not in COPY_BYTES:
        return 0.0  # BF16 (or a dtype the job trains in): nothing to quantize
    reads = 1 + AMAX_PASSES[recipe] + (1 if rht and recipe == "NVFP4BlockScaling" else 0)
    return elements * (BF16_BYTES * reads + copies * COPY_BYTES[recipe])


def quant_bytes(recipe: str, shape: GemmShape, schedule: str = "training") -> float:
    """Quantization bytes charged to one GEMM pass (``shape``: the pass as written, M x K x N with
    dgrad M x N x K and wgrad K x M x N, shapes.py) under ``schedule``.

    Example (DelayedScaling, fprop 4 x 8 x 16: X 32 and W 128 elements, 2 + 1 + 1 bytes each):
        >>> quant_bytes("DelayedScaling", GemmShape(4, 8, 16, GemmOp.FPROP))
        640.0
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    b = shape.batch
    m, k, n = shape.m, shape.k, shape.n
    if schedule == "te_benchmark":  # a forward te.Linear on the pass's sizes: input M x K, weight N x K
        return operand_bytes(recipe, b * m * k, 2, rht=True) + operand_bytes(recipe, b * n * k, 1)
    if shape.op is GemmOp.FPROP:
        return operand_bytes(recipe, b * m * k, 2, rht=True) + operand_bytes(recipe, b * n * k, 2)
    if shape.op.sized_as is GemmOp.DGRAD:  # dgrad M x N x K: the output gradient is M x N (here m x k)
        return operand_bytes(recipe, b * m * k, 2, rht=True)
    return 0.0  # wgrad: both operands were quantized by fprop and dgrad


def output_bytes(shape: GemmShape) -> float:
    """Bytes of a GEMM's BF16 output (M x N per product)."""
    return shape.batch * shape.m * shape.n * BF16_BYTES


def gemm_io_bytes(fmt: str, shape: GemmShape) -> float:
    """Bytes a GEMM itself must move at least: both operands in ``fmt`` once, the BF16 output once
    (the memory floor under a compute-bound projection)."""
    per = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16}[fmt]
    b = shape.batch
    return b * ((shape.m * shape.k + shape.k * shape.n) * per + shape.m * shape.n * BF16_BYTES)
