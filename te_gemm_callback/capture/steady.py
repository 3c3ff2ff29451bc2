"""Steady state: a profiled step's time counts only once the job runs as it will keep running. Unsteady steps:
``torch.compile`` compiling (dynamo's counters; compile steps wait for it, :class:`SteadyWait`), CUDA graph captures
(:class:`GraphCaptures`), and anything else far slower (:func:`outliers`). A compiled frame entered once under a
TorchDispatchMode is skipped for good (docs/results/h200.md, facts the code relies on: steady state), so
instrumented steps run compiled modules' eager forward (:class:`EagerCompiled`)."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from te_gemm_callback.capture.step_plan import CLEAN, COMPILE, GRAPH_CAPTURE, OUTLIER, RECOMPILE, SETTLE

# A clean step above this many times the faster half's median is an outlier; a ratio, since a MAD rule flags
# ordinary noise (docs/results/h200.md, facts the code relies on: outliers).
OUTLIER_FACTOR = 3.0
MIN_FOR_OUTLIERS = 4  # fewer clean steps are never judged: a loaded host alone moves single steps that far
# A clean step the job paused us in for this share of a median step more than usual held an evaluation or a
# checkpoint: an outlier whatever its time.
AWAY_SHARE = 0.25
AWAY_FLOOR_MS = 50.0  # and by this much: a loaded host's stall between two steps is no evaluation

# Counters that move only when something compiles, never on a call of compiled code
# (docs/results/h200.md, facts the code relies on: compile counters).
_COMPILE_COUNTERS = (("frames", "total"), ("stats", "unique_graphs"), ("aot_autograd", "total"),
                     ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_hit"),
                     ("inductor", "fxgraph_cache_bypass"), ("compiled_autograd", "captures"),
                     ("compiled_autograd", "compiles"))


def _counter(cat: str, name: str) -> int:
    du = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was ever compiled
    c = getattr(du, "counters", None)
    # .get: reading must not add empty categories to the job's counters.
    return (c.get(cat) or {}).get(name, 0) if c is not None else 0


def graphs_compiled() -> int:
    return _counter("stats", "unique_graphs")


def compiled_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules of ``model`` that run compiled code: OptimizedModules, ``module.compile()``d ones, and
    ones whose ``forward`` was replaced by a compiled function (Lightning compiles a LightningModule so)."""
    return {name: m for name, m in model.named_modules()
            if (type(m).__name__ == "OptimizedModule" and "_orig_mod" in m._modules)
            or m.__dict__.get("_compiled_call_impl") is not None or compiled_forward(m)}


def compiled_forward(m: nn.Module) -> bool:
    """``m.forward = torch.compile(m.forward)``: dynamo's wrapper, as an instance attribute."""
    return hasattr(m.__dict__.get("forward"), "_torchdynamo_orig_callable")


class EagerCompiled:
    """Compiled modules run their eager forward between ``enter`` and ``exit``; dynamo's code and caches stay."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        self.modules = modules
        self._saved: list[tuple[nn.Module, str, Any]] = []
        self._stance: Any = None

    def enter(self) -> None:
        if self._saved or self._stance is not None:
            return
        stance = getattr(torch.compiler, "set_stance", None)  # torch 2.6 and later
        if stance is not None and any(compiled_forward(m) for m in self.modules.values()):
            # A compiled function has no eager forward to swap in; dynamo's own switch runs it eagerly, and
            # its first compile is not traced through our hooks (a graph the job would keep).
            self._stance = stance("force_eager")
        for m in self.modules.values():
            d = m.__dict__  # written directly: OptimizedModule.__setattr__ forwards most names
            if d.get("_compiled_call_impl") is not None:
                self._saved.append((m, "_compiled_call_impl", d["_compiled_call_impl"]))
                d["_compiled_call_impl"] = None  # Module._wrapped_call_impl then calls _call_impl
            if type(m).__name__ == "OptimizedModule" and "forward" in d:
                self._saved.append((m, "forward", d["forward"]))
                # What dynamo's wrapper runs, without dynamo: the original module's hooks and forward.
                d["forward"] = cast(nn.Module, m._modules["_orig_mod"]).__call__

    def exit(self) -> None:
        saved, self._saved = self._saved, []
        for m, name, v in reversed(saved):
            m.__dict__[name] = v
        stance, self._stance = self._stance, None
        if stance is not None:
            stance.__exit__(None, None, None)  # the stance the job had


class GraphCaptures:
    """Counts CUDA graph captures (``CUDAGraph.capture_begin``: torch, inductor and TE all call it) while installed."""

    count = 0
    _users = 0
    _saved: tuple[Any, Any, bool] | None = None  # (wrapper, original, the class defined it itself)

    @classmethod
    def install(cls) -> None:
        graph_cls = _graph_class()
        if graph_cls is None or not hasattr(graph_cls, "capture_begin"):
            return
        if cls._users == 0:
            own = "capture_begin" in vars(graph_cls)
            orig = graph_cls.capture_begin

            def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
                GraphCaptures.count += 1
                return orig(self, *args, **kwargs)

            graph_cls.capture_begin = capture_begin
            cls._saved = (capture_begin, orig, own)
        cls._users += 1

    @classmethod
    def uninstall(cls) -> None:
        if cls._users == 0:
            return
        cls._users -= 1
        graph_cls = _graph_class()
        if cls._users or cls._saved is None or graph_cls is None:
            return
        wrapper, orig, own = cls._saved
        cls._saved = None
        if vars(graph_cls).get("capture_begin") is not wrapper:
            return  # patched again over ours since: theirs stays (ours only counts, calls through)
        if own:
            graph_cls.capture_begin = orig
        else:
            delattr(graph_cls, "capture_begin")  # it was inherited: inherit it again


def _graph_class() -> Any:
    return getattr(sys.modules.get("torch.cuda"), "CUDAGraph", None)


def activity() -> tuple[int, int]:
    """(dynamo, AOT autograd and inductor compiles; CUDA graph captures) so far: a step's difference says what ran."""
    return sum(_counter(cat, name) for cat, name in _COMPILE_COUNTERS), GraphCaptures.count


@dataclass
class SteadyWait:
    """A compiled model's compile steps: until one neither compiles nor captures a graph, at most ``limit``."""

    limit: int
    waiting: bool = False
    lead: int = 0  # steps before the plan (the compile steps)
    busy: int = 0  # compile steps in which something compiled or captured
    ran_out: bool = False

    def close(self, i: int, moved: bool) -> None:
        self.busy += moved
        if not moved or i + 1 >= self.limit:
            self.waiting, self.lead = False, i + 1
            self.ran_out = moved


def outlier_ref(times: list[float]) -> float | None:
    """The faster half's median of the clean steps (robust while up to half are slow); None below MIN_FOR_OUTLIERS."""
    if len(times) < MIN_FOR_OUTLIERS:
        return None
    return statistics.median(sorted(times)[: (len(times) + 1) // 2])


def outliers(times: list[float], factor: float = OUTLIER_FACTOR) -> list[int]:
    """Indices of the times more than ``factor`` times :func:`outlier_ref`."""
    ref = outlier_ref(times)
    return [i for i, t in enumerate(times) if ref and t > factor * ref]


@dataclass
class Steadiness:
    """Final step kinds, and a one-line verdict on steady state."""

    kinds: list[str]
    verdict: str
    reached: bool | None  # None: not checkable (fewer than 2 clean steps planned, nothing unsteady)
    unsteady: dict[str, list[int]] = field(default_factory=dict)


def away(ms: list[float], paused: list[float], share: float = AWAY_SHARE) -> list[int]:
    """Indices of the steps the job paused us in longer than usual by ``share`` of a median step and AWAY_FLOOR_MS."""
    if len(ms) < 2:
        return []
    typical, step = statistics.median(paused), statistics.median(ms)
    return [i for i, p in enumerate(paused) if p - typical > max(share * step, AWAY_FLOOR_MS)]


def assess(kinds: list[str], moved: list[tuple[int, int]], ms: list[float], wait: SteadyWait,
           paused: list[float] | None = None) -> Steadiness:
    """Retag steps that compiled or captured a graph, and slow or paused clean steps as outliers; say whether
    steady state was reached."""
    kinds = list(kinds)
    for i, (c, g) in enumerate(moved):
        if kinds[i] in (CLEAN, SETTLE) and (c or g):
            kinds[i] = RECOMPILE if c else GRAPH_CAPTURE
    clean = [i for i, k in enumerate(kinds) if k == CLEAN]
    slow = [clean[j] for j in outliers([ms[i] for i in clean])]
    gone = [clean[j] for j in away([ms[i] for i in clean], [paused[i] for i in clean])] if paused else []
    gone = [i for i in gone if i not in slow]
    slow = sorted(slow + gone)
    for i in slow:
        kinds[i] = OUTLIER
    unsteady = {k: [i for i, x in enumerate(kinds) if x == k] for k in (COMPILE, RECOMPILE, GRAPH_CAPTURE, OUTLIER)}
    unsteady = {k: v for k, v in unsteady.items() if v}
    left = len(clean) - len(slow)
    dropped = [f"{len(v)} {k} (step{'s' if len(v) > 1 else ''} {', '.join(map(str, v))})"
               for k, v in unsteady.items() if k != COMPILE]
    if slow:  # the outliers come last in ``dropped``: say what they were judged against
        ref = outlier_ref([ms[i] for i in clean])
        reasons = [f"above {OUTLIER_FACTOR:g}x the faster half's median ({ref:.3g} ms)"] \
            if ref and len(gone) < len(slow) else []
        if gone:
            steps = ", ".join(map(str, gone))
            reasons.append(f"with the job away between steps (an evaluation, a checkpoint: {steps})")
        dropped[-1] += " " + "; ".join(reasons)
    lead = f" after {wait.lead} compile step{'s' if wait.lead > 1 else ''}" if wait.lead else ""
    out = f"; left out: {', '.join(dropped)}" if dropped else ""
    if wait.waiting:
        return Steadiness(kinds, f"not reached: dynamo compiled (or a CUDA graph was captured) in every one of the "
                                 f"{len(kinds)} steps; no instrumented or clean step ran: profile more steps",
                          False, unsteady)
    if wait.ran_out:
        return Steadiness(kinds, f"not reached: still compiling after {wait.lead} compile steps (max_compile_steps); "
                                 f"the plan ran after them anyway, {left} clean step(s) left{out}", False, unsteady)
    planned = sum(k in (CLEAN, RECOMPILE, GRAPH_CAPTURE, OUTLIER) for k in kinds)
    if left >= 2:
        return Steadiness(kinds, f"reached: {left} clean steps{lead}{out}", True, unsteady)
    if dropped or (wait.busy and planned < 2):
        why = "the unsteady steps" if dropped else "the compile steps"
        return Steadiness(kinds, f"not reached: {left} clean step(s) left{lead}, fewer than 2: {why} took the "
                                 f"window{out}", False, unsteady)
    return Steadiness(kinds, f"not checked: {left} clean step(s){lead}, 2 are needed to check it", None, unsteady)
