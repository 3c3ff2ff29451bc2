"""What to benchmark: one work item per GEMM of the job (from a model config, a capture or shapes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, config_gemms, fprop_of, gemm_passes


@dataclass(frozen=True)
class WorkItem:
    """One GEMM of the job: its fprop shape, how often a step runs it, and the passes it runs.

    ``m_splits``: a grouped (MoE) GEMM, M = sum(m_splits). ``weight``: False for a GEMM of two
    activations. ``passes``: (pass, calls per call of the item) in GemmOp order; empty for all three once.
    """

    name: str
    fprop: GemmShape
    count: float = 1.0
    m_splits: tuple[int, ...] | None = None
    weight: bool = True
    passes: tuple[tuple[GemmOp, float], ...] = ()

    @property
    def key(self) -> tuple:
        """What one job measures for every item sharing it (a weightless GEMM is not a layer's job)."""
        return (self.fprop.m, self.fprop.k, self.fprop.n, self.fprop.batch, self.m_splits, self.weight)

    @property
    def runs_recipe(self) -> bool:
        """A linear layer; batched and weightless GEMMs are torch matmuls under every recipe."""
        return self.weight and self.fprop.batch == 1

    @property
    def ops(self) -> tuple[GemmOp, ...]:
        return tuple(op for op, _ in self.passes) if self.passes else tuple(s.op for s in self.all_passes)

    @property
    def all_passes(self) -> tuple[GemmShape, GemmShape, GemmShape]:
        return gemm_passes(self.fprop, self.weight)

    def calls_of(self, op: GemmOp) -> float:
        """Calls of pass ``op`` per call of the item (1 for each of a layer's three by default)."""
        if not self.passes:
            return 1.0
        return next((n for o, n in self.passes if o is op), 0.0)


def passes_of(item: WorkItem) -> tuple[GemmShape, ...]:
    """The shapes of the passes the item runs, in GemmOp order."""
    ops = set(item.ops)
    return tuple(s for s in item.all_passes if s.op in ops)


def merged(a: WorkItem, b: WorkItem) -> WorkItem:
    """One job's item for two items of one key: every pass either runs."""
    if not (a.passes and b.passes):
        return a if not a.passes else b
    ops = dict(a.passes) | dict(b.passes)
    return replace(a, passes=tuple((op, ops[op]) for op in GemmOp if op in ops))


def items_from_config(cfg: ModelConfig) -> list[WorkItem]:
    return [WorkItem(g.name, g.fprop, float(g.count(cfg)), g.m_splits) for g in config_gemms(cfg)]


def items_from_shapes(shapes: Iterable[GemmShape]) -> list[WorkItem]:
    return [WorkItem(s.mkn, fprop_of(s)) for s in shapes]


def representative_splits(calls: list[list[int]], k: int = 3) -> list[tuple[tuple[int, ...], float]]:
    """The m_splits to time for a grouped GEMM whose routing changed between calls, each with its
    share of the calls: every distinct split if at most ``k``, else ``k`` calls evenly spaced in
    the order of their imbalance (largest group / mean)."""
    distinct = Counter(tuple(s) for s in calls)
    if len(distinct) <= k:
        return [(s, n / len(calls)) for s, n in distinct.items()]
    ranked = sorted((tuple(s) for s in calls), key=lambda s: max(s) * len(s) / max(sum(s), 1))
    picks = [ranked[round(i * (len(ranked) - 1) / (k - 1))] for i in range(k)]
    return [(s, 1.0 / k) for s in picks]


def items_from_capture(cap: GemmCapture) -> list[WorkItem]:
    """One item per captured GEMM (name, forward shape) with the passes the job ran, recomputes left
    out; a grouped GEMM whose routing changed becomes one item per :func:`representative_splits`."""
    groups: dict[tuple, dict[str, Any]] = {}
    for r in cap.records:
        if r.recompute:
            continue
        f = fprop_of(r.shape)
        g = groups.setdefault((r.name, f), {"calls": {}, "weight": True, "splits": [], "fprop_splits": []})
        op = GemmOp(r.op)
        g["calls"][op] = g["calls"].get(op, 0.0) + r.calls_per_step
        g["weight"] = g["weight"] and not op.weightless
        g["fprop_splits" if op is GemmOp.FPROP else "splits"].extend(r.m_splits)
    items: list[WorkItem] = []
    for (name, f), g in groups.items():
        calls: dict[GemmOp, float] = g["calls"]
        # Its fprop's calls; captured in backward only: its most frequent pass's.
        count = calls.get(GemmOp.FPROP) or max(calls.values())
        passes = tuple((op, calls[op] / count if count else 1.0) for op in GemmOp if op in calls)
        splits_of_calls = g["fprop_splits"] or g["splits"]
        for splits, share in (representative_splits(splits_of_calls) if splits_of_calls else [(None, 1.0)]):
            items.append(WorkItem(name, f, count * share, splits, g["weight"], passes))
    return items
