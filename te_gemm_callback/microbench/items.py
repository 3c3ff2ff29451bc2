"""What to benchmark: work items, one per GEMM of the job (from a model config, a capture or a
shape list), with the passes each runs and how often a step runs it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, config_gemms, fprop_of, gemm_passes


@dataclass(frozen=True)
class WorkItem:
    """One GEMM of the job: its fprop shape, how often a step runs it, and the passes it runs.

    ``m_splits`` marks a grouped (MoE) GEMM: M = sum(m_splits), one group per expert. ``weight``:
    a linear layer (fprop, dgrad, wgrad); False for a GEMM of two activations (fprop, dgrad_a,
    dgrad_b: shapes.py). ``passes``: each pass the job runs with its calls per call of the item
    (the count), in GemmOp order; empty for all three once each (a config's or a shape list's layer).
    A first layer whose input needs no gradient has no dgrad, and the bench times none.
    """

    name: str
    fprop: GemmShape
    count: float = 1.0
    m_splits: tuple[int, ...] | None = None
    weight: bool = True
    passes: tuple[tuple[GemmOp, float], ...] = ()

    @property
    def key(self) -> tuple:
        """What one job measures for every item that shares it (repeated layers). A TE recipe runs
        only linear layers, so a GEMM without a weight is timed apart from a layer of its sizes."""
        return (self.fprop.m, self.fprop.k, self.fprop.n, self.fprop.batch, self.m_splits, self.weight)

    @property
    def runs_recipe(self) -> bool:
        """Whether a TE recipe runs this GEMM (a te.Linear / te.GroupedLinear layer: one product with
        a weight). Batched and weightless GEMMs (torch.bmm, an einsum of activations) run as they
        are whatever the recipe: the bench times them as torch matmuls under every recipe."""
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
    """The shapes of the passes the item runs (a subset of fprop, dgrad, wgrad or of fprop,
    dgrad_a, dgrad_b), in that order."""
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
    """The m_splits to time for a grouped GEMM whose routing changed from call to call, each with
    its share of the calls: every distinct split when there are at most ``k``, else ``k`` calls
    evenly spaced in the order of their imbalance (largest group / mean), equal shares."""
    distinct: dict[tuple[int, ...], int] = {}
    for s in calls:
        distinct[tuple(s)] = distinct.get(tuple(s), 0) + 1
    if len(distinct) <= k:
        return [(s, n / len(calls)) for s, n in distinct.items()]
    ranked = sorted((tuple(s) for s in calls), key=lambda s: max(s) * len(s) / max(sum(s), 1))
    picks = [ranked[round(i * (len(ranked) - 1) / (k - 1))] for i in range(k)]
    return [(s, 1.0 / k) for s in picks]

def items_from_capture(cap: GemmCapture) -> list[WorkItem]:
    """One item per captured GEMM (owner and sub-GEMM, forward shape): the passes the job ran, each
    at its calls per step, and nothing it did not run (a layer whose input needs no gradient ran
    no dgrad). Every kind is covered: linear layers, grouped (MoE) GEMMs, and batched or
    weightless GEMMs (attention's bmm in eager code), the latter timed as the torch matmuls they
    are (:attr:`WorkItem.runs_recipe`). Recomputes (activation checkpointing) are left out: they
    are fprop again, of the same cell.

    A grouped GEMM whose routing changed between calls becomes a few items, one per
    representative m_splits (:func:`representative_splits`), its calls shared between them.
    Captures written before the weightless pass names existed (a bmm's "dgrad" and "wgrad") give
    items with those passes, timed as the batched GEMMs they are.
    """
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
        # Calls of the item: its fprop's (each backward pass follows one); a GEMM captured in
        # backward only (its forward ran unseen), its most frequent pass's.
        count = calls.get(GemmOp.FPROP) or max(calls.values())
        passes = tuple((op, calls[op] / count if count else 1.0) for op in GemmOp if op in calls)
        splits_of_calls = g["fprop_splits"] or g["splits"]
        for splits, share in (representative_splits(splits_of_calls) if splits_of_calls else [(None, 1.0)]):
            items.append(WorkItem(name, f, count * share, splits, g["weight"], passes))
    return items
