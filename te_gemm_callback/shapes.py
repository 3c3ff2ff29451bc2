"""GEMM shapes: the one convention used everywhere in this package.

A linear layer computes ``Y = X W^T``, X (M, K), W (N, K); M is the product of the input's leading
dimensions. Shapes are written ``M x K x N`` (left operand's rows, contraction, output columns), and
every pass costs ``2*M*K*N`` FLOPs. :func:`backward_shapes` alone derives the backward passes:

=======  ==============  ===================  =======================
pass     computes        written (M x K x N)   TE ``general_gemm`` layout
=======  ==============  ===================  =======================
fprop    Y  = X W^T      M x K x N             "TN"
dgrad    dX = dY W       M x N x K             "NN", grad=True
wgrad    dW = dY^T X     K x M x N             "NT", grad=True
=======  ==============  ===================  =======================

wgrad is written as TE's ``benchmarks/gemm/benchmark_gemm.py`` does, so printed shapes paste into
its ``--shapes``. A GEMM with no weight (``C = A @ B``: attention's ``Q K^T``) has dgrad_a (dA = dC B^T)
and dgrad_b (dB = A^T dC), written as dgrad and wgrad are (older captures label them so, and still load).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field

from te_gemm_callback.files.jsonio import MAX_DIM


class GemmOp(str, enum.Enum):
    """Which pass a GEMM belongs to (the module docstring's table)."""

    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"
    DGRAD_A = "dgrad_a"
    DGRAD_B = "dgrad_b"

    def __str__(self) -> str:  # "fprop", not "GemmOp.FPROP", in tables and JSON
        return self.value

    @property
    def sized_as(self) -> GemmOp:
        """The linear-layer pass written with the same sizes: dgrad_a as dgrad, dgrad_b as wgrad."""
        return _SIZED_AS.get(self, self)

    @property
    def weightless(self) -> bool:
        """A backward pass of a GEMM without a weight."""
        return self in _SIZED_AS


_SIZED_AS = {GemmOp.DGRAD_A: GemmOp.DGRAD, GemmOp.DGRAD_B: GemmOp.WGRAD}
# Every pass name a capture or a bench file may hold, in the order tables list them.
PASS_NAMES = tuple(op.value for op in GemmOp)


@dataclass(frozen=True, order=True)
class GemmShape:
    """One GEMM, ``batch`` independent products of (m x k) @ (k x n).

    >>> GemmShape(8192, 4096, 6144).flops
    412316860416
    """

    m: int
    k: int
    n: int
    op: GemmOp = GemmOp.FPROP
    batch: int = 1

    def __post_init__(self) -> None:
        if min(self.m, self.k, self.n, self.batch) < 0:
            raise ValueError(f"GEMM dimensions must be >= 0, got {self}")
        object.__setattr__(self, "op", GemmOp(self.op))

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    @property
    def mkn(self) -> str:
        prefix = f"{self.batch}x" if self.batch != 1 else ""
        return f"{prefix}{self.m}x{self.k}x{self.n}"

    def to_dict(self) -> dict:
        return {**asdict(self), "op": str(self.op)}


def backward_shapes(fprop: GemmShape, weight: bool = True) -> tuple[GemmShape, GemmShape]:
    """(dgrad, wgrad) of a linear layer's fprop, or (dgrad_a, dgrad_b) with ``weight=False``."""
    if fprop.op is not GemmOp.FPROP:
        raise ValueError(f"expected an fprop shape, got {fprop.op}")
    m, k, n, b = fprop.m, fprop.k, fprop.n, fprop.batch
    da, db = (GemmOp.DGRAD, GemmOp.WGRAD) if weight else (GemmOp.DGRAD_A, GemmOp.DGRAD_B)
    # dX = dY W (dA = dC B^T) contracts over N; dW = dY^T X (dB = A^T dC) over the tokens (M).
    return GemmShape(m, n, k, da, b), GemmShape(k, m, n, db, b)


def gemm_passes(fprop: GemmShape, weight: bool = True) -> tuple[GemmShape, GemmShape, GemmShape]:
    """(fprop, dgrad, wgrad) of one linear layer; (fprop, dgrad_a, dgrad_b) with ``weight=False``."""
    return (fprop, *backward_shapes(fprop, weight))


def fprop_of(shape: GemmShape) -> GemmShape:
    """Inverse of :func:`backward_shapes`: the forward GEMM a backward pass belongs to."""
    sized = shape.op.sized_as
    if sized is GemmOp.DGRAD:
        return GemmShape(shape.m, shape.n, shape.k, GemmOp.FPROP, shape.batch)
    if sized is GemmOp.WGRAD:
        return GemmShape(shape.k, shape.m, shape.n, GemmOp.FPROP, shape.batch)
    return shape


def parse_shapes(text: str) -> list[GemmShape]:
    """Parse ``"MxKxN,MxKxN"`` (the ``--shapes`` format of TE's benchmark_gemm.py) into fprop shapes."""
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.lower().split("x")
        # ASCII digits only: str.isdigit() and int() also take other scripts' digits ("８x８x８").
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"bad shape {item!r}: write M x K x N as positive integers in ASCII digits, "
                             "e.g. 4096x4096x4096")
        m, k, n = map(int, parts)
        if max(m, k, n) > MAX_DIM:  # no GPU runs it, and its FLOPs would overflow a float
            raise ValueError(f"bad shape {item!r}: each dimension must be at most {MAX_DIM}")
        shapes.append(GemmShape(m, k, n))
    if not shapes:
        raise ValueError("no shapes given: write them as MxKxN,MxKxN")
    return shapes


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-style transformer, enough to derive its GEMMs (here Llama-3-8B-like):

    >>> cfg = ModelConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
    ...                   num_key_value_heads=8, gated_mlp=True, num_hidden_layers=32,
    ...                   micro_batch_size=1, sequence_length=8192)
    >>> [g.name for g in config_gemms(cfg)]
    ['qkv', 'proj', 'fc1', 'fc2']
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    micro_batch_size: int
    sequence_length: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    gated_mlp: bool = False
    fused_qkv: bool = True
    fused_gate_up: bool = True
    num_experts: int = 0
    top_k: int = 1
    tensor_parallel: int = 1
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        positive = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                    "micro_batch_size", "sequence_length", "tensor_parallel", "top_k")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer")
        for name in (*positive, "num_key_value_heads", "head_dim", "num_experts", "vocab_size"):
            v = getattr(self, name)
            if v is not None and v > MAX_DIM:  # no GPU runs such a GEMM, and its FLOPs overflow a float
                raise ValueError(f"--{name.replace('_', '-')} must be at most {MAX_DIM}, got {v}")
        if self.tokens > MAX_DIM:
            raise ValueError(f"--micro-batch-size x --sequence-length (the GEMMs' M) must be at most {MAX_DIM}, "
                             f"got {self.tokens}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden size is not divisible by the number of heads: pass --head-dim")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError("--num-attention-heads must be a multiple of --num-key-value-heads")
        if self.num_experts < 0:
            raise ValueError("--num-experts must be >= 0 (0: a dense MLP)")
        if self.num_experts and self.top_k > self.num_experts:
            raise ValueError("--top-k must be <= --num-experts")
        if not self.num_experts and self.top_k != 1:
            raise ValueError("--top-k is the experts each token goes to: give --num-experts too (0: a dense MLP)")
        tp = self.tensor_parallel
        if self.num_attention_heads % tp or self.intermediate_size % tp:
            raise ValueError("--tensor-parallel must divide the head count and intermediate size")
        if self.vocab_size is not None and (self.vocab_size <= 0 or self.vocab_size % tp):
            raise ValueError(f"--vocab-size ({self.vocab_size}) must be positive and divisible by "
                             f"--tensor-parallel ({tp}): pad the vocabulary as the model does")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.sequence_length


@dataclass(frozen=True)
class ConfigGemm:
    """One weight GEMM of the model: its fprop shape and how often one step runs it."""

    name: str
    fprop: GemmShape
    per_layer: bool = True  # False for once-per-model GEMMs (lm_head)
    m_splits: tuple[int, ...] | None = None  # MoE: tokens routed to each expert
    parallel: str = "column"  # tensor-parallel style: column, row or replicated
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def count(self, cfg: ModelConfig) -> int:
        return cfg.num_hidden_layers if self.per_layer else 1


def config_gemms(cfg: ModelConfig) -> list[ConfigGemm]:
    """The weight GEMMs one micro-batch runs (attention's QK^T and softmax x V run in fused kernels that
    no GEMM recipe changes)."""
    tp = cfg.tensor_parallel
    m, h, hd = cfg.tokens, cfg.hidden_size, cfg.dim_head
    q_width, kv_width = cfg.num_attention_heads * hd, cfg.kv_heads * hd
    out: list[ConfigGemm] = []
    # Column-parallel layers split N by TP, row-parallel ones split K (Megatron-LM, Shoeybi et al. 2019, sec. 3).
    if cfg.fused_qkv:
        out.append(ConfigGemm("qkv", GemmShape(m, h, (q_width + 2 * kv_width) // tp),
                              notes=f"({cfg.num_attention_heads} + 2 x {cfg.kv_heads}) heads x {hd}"))
    else:
        out += [ConfigGemm(name, GemmShape(m, h, width // tp))
                for name, width in (("q", q_width), ("k", kv_width), ("v", kv_width))]
    out.append(ConfigGemm("proj", GemmShape(m, q_width // tp, h), parallel="row"))
    inter = cfg.intermediate_size // tp
    splits, mlp_m, extra = None, m, {}
    if cfg.num_experts:
        e, k = cfg.num_experts, cfg.top_k
        mlp_m, extra = m * k, {"num_experts": e, "top_k": k}
        # Balanced routing: the config cannot know the real split; a capture records it.
        splits = tuple(mlp_m // e + (1 if i < mlp_m % e else 0) for i in range(e))
        out.append(ConfigGemm("router", GemmShape(m, h, e), parallel="replicated"))
    if cfg.gated_mlp and not cfg.fused_gate_up:
        out += [ConfigGemm(name, GemmShape(mlp_m, h, inter), m_splits=splits, extra=extra) for name in ("gate", "up")]
    else:
        out.append(ConfigGemm("fc1", GemmShape(mlp_m, h, 2 * inter if cfg.gated_mlp else inter), m_splits=splits,
                              notes="gate+up fused (2I)" if cfg.gated_mlp else "", extra=extra))
    out.append(ConfigGemm("fc2", GemmShape(mlp_m, inter, h), m_splits=splits, parallel="row", extra=extra))
    if cfg.vocab_size:
        out.append(ConfigGemm("lm_head", GemmShape(m, h, cfg.vocab_size // tp), per_layer=False))
    return out


def unique_shapes(shapes: list[GemmShape]) -> list[GemmShape]:
    """Deduplicate, keeping first-seen order (repeated layers share shapes)."""
    return list(dict.fromkeys(shapes))
