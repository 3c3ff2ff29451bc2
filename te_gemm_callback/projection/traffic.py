"""The memory traffic a recipe's quantization adds to a GEMM: per element of a BF16 operand, 2 bytes per
read (amax pass, cast, NVFP4's Hadamard transform) and the bytes each copy writes (data and block scales).

Schedules: ``training`` (``te-gemm bench``'s autocast mode): fprop quantizes X and W, dgrad dY, each with both
copies. ``te_benchmark`` (TE's benchmarks/gemm/benchmark_gemm.py): the input with both copies, the weight rowwise.
"""

from __future__ import annotations

from te_gemm_callback.shapes import GemmOp, GemmShape

SCHEDULES = ("training", "te_benchmark")

# Bytes written per element per copy: data + block scales (an FP32 per 128, an E8M0 per 32, E4M3 per 16).
COPY_BYTES = {"DelayedScaling": 1.0, "Float8CurrentScaling": 1.0, "Float8BlockScaling": 1.0 + 4 / 128,
              "MXFP8BlockScaling": 1.0 + 1 / 32, "NVFP4BlockScaling": 0.5 + 1 / 16}
# Passes that only read the operand for its amax (the scale is its own), before the cast.
AMAX_PASSES = {"DelayedScaling": 0, "Float8CurrentScaling": 1, "Float8BlockScaling": 0, "MXFP8BlockScaling": 0,
               "NVFP4BlockScaling": 1}
BF16_BYTES = 2.0


def operand_bytes(recipe: str, elements: float, copies: int, rht: bool = False) -> float:
    """Bytes moved to quantize one BF16 operand of ``elements`` values into ``copies`` copies.

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
    """Quantization bytes charged to one GEMM pass (as written: dgrad M x N x K, wgrad K x M x N).

    Example (DelayedScaling, fprop 4 x 8 x 16: X 32 and W 128 elements, 2 + 1 + 1 bytes each):
        >>> quant_bytes("DelayedScaling", GemmShape(4, 8, 16, GemmOp.FPROP))
        640.0
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    b, m, k, n = shape.batch, shape.m, shape.k, shape.n
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
    """Bytes a GEMM itself must move at least: both operands in ``fmt`` and the BF16 output, once."""
    per = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16}[fmt]
    b = shape.batch
    return b * ((shape.m * shape.k + shape.k * shape.n) * per + shape.m * shape.n * BF16_BYTES)
