"""Steady state: a profiled step's time counts only once the job runs as it will keep running.

What keeps a step from being steady, and how each is seen without touching the job:

- ``torch.compile``: dynamo compiles on a frame's first calls and again on a guard failure (a new
  input shape). Seen by dynamo's own counters (:func:`compile_activity`), read at each step
  boundary: a step in which they moved compiled. A compiled model's first steps run as "compile"
  steps, nothing attached, until a step runs with no compilation (:class:`SteadyWait`); a clean
  step in which they moved anyway is a "recompile" step.
- CUDA graph captures (inductor's ``mode="reduce-overhead"`` records on the first calls after a
  compile; ``te.make_graphed_callables``): counted by :class:`GraphCaptures`; a step that captured
  one is a "graph-capture" step.
- Anything else far slower (a GC pass, a checkpoint write, allocator growth): :func:`outliers`.

Never make a compiled job run eager: a compiled module called even once under a TorchDispatchMode (the
profiler's shape-discovery step) can stay eager for the rest of the process (docs/results/h200.md,
facts the code relies on: steady state). Dynamo's frame callback
(``convert_frame.CatchErrorsWrapper``) skips a frame while a dispatch mode without
``ignore_compile_internals()`` is on the stack, and the skip it returns (``ConvertFrameReturn``:
``FrameAction.SKIP``, ``apply_to_code=True``) marks the code object skipped for good, cached code or
not. For a ``torch.nn.*`` module that code object is ``external_utils.wrap_inline``'s inner function,
shared by every compiled ``torch.nn`` module of the process: one call under the mode turns them all
eager. A later torch made that skip transient (pytorch#190287), which moves the compile into the first
step after the dispatch one. So: the instrumented steps run compiled modules' eager forward
(:class:`EagerCompiled`, as for CUDA-graphed modules), dynamo never sees the mode on their frames, and
the compiled code is left as it was; and the dispatch mode says ``ignore_compile_internals()``
(torch >= 2.9), so a compiled frame it cannot swap (a compiled loss or step function) is compiled
with the mode off and runs compiled under it, never skipped.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, cast

from torch import nn

from te_gemm_callback.capture.step_plan import CLEAN, COMPILE, GRAPH_CAPTURE, OUTLIER, RECOMPILE, SETTLE

# Clean steps more than this many times the typical fast clean step are outliers. Steady step
# scatter on a host of its own stays far inside it, while what it is meant to catch (compile steps,
# first runs after an inductor compile) is far outside (docs/results/h200.md, facts the code relies
# on: outliers). A ratio, not a MAD rule: steady steps agree so closely that a MAD rule flags ordinary
# noise (at +-0.5 ms scatter, a step 3% slow is 6 MADs out), and leaving those out would bias the
# median low. A host shared with other jobs can move steps past it (below).
OUTLIER_FACTOR = 3.0
# Fewer clean steps than this are never judged: with 2 or 3 the reference is one or two steps, and a
# loaded host alone moves single steps that far (docs/results/h200.md, facts the code relies on:
# outliers); from 4 the faster half is two steps.
MIN_FOR_OUTLIERS = 4

# Counters that move only when something compiles (dynamo frames, graphs, AOT autograd, inductor's
# lazily compiled backward, compiled autograd); none moves on a call of already compiled code
# (docs/results/h200.md, facts the code relies on: compile counters).
_COMPILE_COUNTERS = (("frames", "total"), ("stats", "unique_graphs"), ("aot_autograd", "total"),
                     ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_hit"),
                     ("inductor", "fxgraph_cache_bypass"), ("compiled_autograd", "captures"),
                     ("compiled_autograd", "compiles"))


def _counters() -> Any:
    du = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was ever compiled
    return getattr(du, "counters", None)


def compile_activity() -> int:
    """A number that grows whenever dynamo, AOT autograd or inductor compiles something."""
    c = _counters()
    if c is None:
        return 0
    # .get: reading must not add empty categories to the job's counters.
    return sum((c.get(cat) or {}).get(name, 0) for cat, name in _COMPILE_COUNTERS)


def graphs_compiled() -> int:
    c = _counters()
    return (c.get("stats") or {}).get("unique_graphs", 0) if c is not None else 0


def compiled_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules of ``model`` that run compiled code when called: ``torch.compile(module)``'s
    OptimizedModule, and modules compiled in place (``module.compile()`` sets ``_compiled_call_impl``)."""
    return {name: m for name, m in model.named_modules()
            if (type(m).__name__ == "OptimizedModule" and "_orig_mod" in m._modules)
            or m.__dict__.get("_compiled_call_impl") is not None}


class EagerCompiled:
    """Compiled modules run their eager forward between ``enter`` and ``exit`` (the instrumented
    steps): dynamo's frames are not entered, so neither the dispatch mode nor the hooks reach
    dynamo, and its compiled code and caches are the same afterwards."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        self.modules = modules
        self._saved: list[tuple[nn.Module, str, Any]] = []

    def enter(self) -> None:
        if self._saved:
            return
        for m in self.modules.values():
            d = m.__dict__  # written directly: OptimizedModule.__setattr__ forwards most names
            if d.get("_compiled_call_impl") is not None:
                self._saved.append((m, "_compiled_call_impl", d["_compiled_call_impl"]))
                d["_compiled_call_impl"] = None  # Module._wrapped_call_impl then calls _call_impl
            if type(m).__name__ == "OptimizedModule" and "forward" in d:
                self._saved.append((m, "forward", d["forward"]))
                # What dynamo's wrapper runs, without dynamo: the original module's hooks and forward.
                d["forward"] = cast(nn.Module, m._modules["_orig_mod"]).__call__  # set on every OptimizedModule

    def exit(self) -> None:
        saved, self._saved = self._saved, []
        for m, name, v in reversed(saved):
            m.__dict__[name] = v


class GraphCaptures:
    """Counts CUDA graph captures (``torch.cuda.CUDAGraph.capture_begin``, which ``torch.cuda.graph``,
    inductor's CUDA graph trees and TE's ``make_graphed_callables`` all call) while installed. The
    wrapper only counts and calls through: nothing runs on a step that captures no graph."""

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
    cuda = sys.modules.get("torch.cuda")
    return getattr(cuda, "CUDAGraph", None) if cuda is not None else None


def activity() -> tuple[int, int]:
    """(compile activity, CUDA graph captures) now; the difference over a step says what it did."""
    return compile_activity(), GraphCaptures.count


@dataclass
class SteadyWait:
    """The compile steps before the plan of a compiled model: waiting until a step runs with no
    compilation and no graph capture, at most ``limit`` steps."""

    limit: int
    waiting: bool = False
    lead: int = 0  # steps before the plan (the compile steps)
    busy: int = 0  # compile steps in which something compiled or captured
    ran_out: bool = False

    def close(self, i: int, moved: bool) -> None:
        """Step ``i``, a compile step, closed; ``moved``: it compiled or captured."""
        self.busy += moved
        if not moved or i + 1 >= self.limit:
            self.waiting, self.lead = False, i + 1
            self.ran_out = moved


def outlier_ref(times: list[float]) -> float | None:
    """The reference outliers are judged against: the median of the faster half of the clean steps
    (stalls only add time, so the faster half is robust while up to half the steps are slow, which a
    plain median is not: 239, 190, 4.6, 3.3 ms has a median of 97). None below ``MIN_FOR_OUTLIERS``."""
    if len(times) < MIN_FOR_OUTLIERS:
        return None
    return statistics.median(sorted(times)[: (len(times) + 1) // 2])


def outliers(times: list[float], factor: float = OUTLIER_FACTOR) -> list[int]:
    """Indices of the times more than ``factor`` times :func:`outlier_ref`."""
    ref = outlier_ref(times)
    return [i for i, t in enumerate(times) if ref and t > factor * ref]


@dataclass
class Steadiness:
    """Final step kinds, and a one-line verdict on steady state, from what each step did."""

    kinds: list[str]
    verdict: str
    reached: bool | None  # None: not checkable (fewer than 2 clean steps planned, nothing unsteady)
    unsteady: dict[str, list[int]] = field(default_factory=dict)


def assess(kinds: list[str], moved: list[tuple[int, int]], ms: list[float], wait: SteadyWait) -> Steadiness:
    """Retag planned clean and settle steps that compiled (recompile) or captured a graph, then
    clean steps far above the others (outlier), and say whether steady state was reached."""
    kinds = list(kinds)
    for i, (c, g) in enumerate(moved):
        if kinds[i] in (CLEAN, SETTLE) and (c or g):
            kinds[i] = RECOMPILE if c else GRAPH_CAPTURE
    clean = [i for i, k in enumerate(kinds) if k == CLEAN]
    slow = [clean[j] for j in outliers([ms[i] for i in clean])]
    for i in slow:
        kinds[i] = OUTLIER
    unsteady = {k: [i for i, x in enumerate(kinds) if x == k] for k in (COMPILE, RECOMPILE, GRAPH_CAPTURE, OUTLIER)}
    unsteady = {k: v for k, v in unsteady.items() if v}
    left = len(clean) - len(slow)
    dropped = [f"{len(v)} {k} (step{'s' if len(v) > 1 else ''} {', '.join(map(str, v))})"
               for k, v in unsteady.items() if k != COMPILE]
    if slow:  # the outliers come last in ``dropped``: say what they were judged against
        ref = outlier_ref([ms[i] for i in clean])
        dropped[-1] += f" above {OUTLIER_FACTOR:g}x the faster half's median ({ref:.3g} ms)"
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
