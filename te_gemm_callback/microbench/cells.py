"""What to benchmark (work items from a config, a capture or a shape list), results, and the cache."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.files.jsonio import (
    BENCH_RESULT,
    CACHE_FILE,
    check,
    from_fields,
    parse_json,
    read_bytes_bounded,
    schema_of,
    write_json,
)
from te_gemm_callback.precisions import RECIPE_TABLE, recipe_fingerprint
from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, config_gemms, fprop_of, gemm_passes

log = logging.getLogger("te_gemm_callback")

MODES = ("autocast", "prequantized")
BENCH_SCHEMA = "te-gemm-bench/1"  # bench.json (microbench/results.py); here so the CLI can check it torch-free
# Every visit times each cell at least once and queues every job again: 1000 (60x the GPU default)
# is hours of host time on a large model; far beyond it the run only fills memory (1e11 was OOM-killed).
MAX_VISITS = 1000
# The least --gemm-duty: the rest between timed calls is call * (1/duty - 1); below this it outlasts
# the calls by over 19x (a duty of 1e-6 rests a million calls' time after each call).
# notes.duty_note suggests no lower value.
MIN_GEMM_DUTY = 0.05
FP8_FAMILY = {r.name for r in RECIPE_TABLE if r.low_precision_peak}  # timed against the FP8 peak


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


# A cell whose spread, IQR / median of its samples (BenchResult.q1_ms, q3_ms: the tables'
# "spread" column), is above this is measured again (engine.REMEASURES); if it stays above, it is
# marked noisy and never cached, and a cached entry above it is refused and re-measured. Quiet
# cells, on a GPU or a CPU, sit far below it and host-starved ones far above, one of them enough to
# make a layer many times slower in every table (docs/benchmark-methodology.md). Above 0.5 a
# quarter of the samples or more lie over a quarter of the median from it: the median then depends
# on which calls the host disturbed.
SPREAD_LIMIT = 0.5


@dataclass
class BenchResult:
    """One (shape, pass, precision, mode) timing, with the conditions it was measured under."""

    m: int
    k: int
    n: int
    op: str
    precision: str
    mode: str
    m_splits: list[int] | None = None
    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    iters: int = 0
    tflops: float | None = None
    peak_fraction: float | None = None
    error: str | None = None
    backend: str = ""  # "te" or "torch"
    padded_m_splits: list[int] | None = None  # rows per group as timed, where the recipe needs alignment
    sm_clock_mhz: float | None = None  # median SM clock (NVML) over the visits that timed this cell
    conditions: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1  # measurements taken (a cell above SPREAD_LIMIT is measured again, the quietest kept)
    noisy: bool = False  # spread still above SPREAD_LIMIT after every attempt: never cached, marked in tables
    cached: bool = False  # reused from the cache (an earlier run's measurement), not measured by this run
    batch: int = 1  # independent products of a batched GEMM (torch.bmm); 1 for every linear layer

    @property
    def shape(self) -> GemmShape:
        return GemmShape(self.m, self.k, self.n, GemmOp(self.op), self.batch)

    @property
    def ok(self) -> bool:
        return self.error is None and self.median_ms is not None

    @property
    def spread(self) -> float | None:
        """IQR / median of the cell's samples (the spread the tables print); None when unknown."""
        med = self.median_ms
        if not self.ok or self.q1_ms is None or self.q3_ms is None or med is None or med <= 0:
            return None
        return (self.q3_ms - self.q1_ms) / med

    @property
    def above_spread_limit(self) -> bool:
        return (self.spread or 0.0) > SPREAD_LIMIT

    @property
    def cell(self) -> tuple:
        """What identifies the cell within a run: shape, pass, grouped splits, precision, mode, batch."""
        return (self.m, self.k, self.n, self.op, tuple(self.m_splits) if self.m_splits else None, self.precision,
                self.mode, self.batch)


def result_key(device: str, versions: str, shape: GemmShape, m_splits: tuple[int, ...] | None,
               precision: str, mode: str, flush_l2: bool, gemm_duty: float = 1.0) -> str:
    splits = ",".join(map(str, m_splits)) if m_splits else "-"
    return "|".join([device, versions, f"{shape.op}:{shape.mkn}", splits, precision, mode,
                     "flush" if flush_l2 else "warm-l2"] + ([f"duty {gemm_duty:g}"] if gemm_duty != 1.0 else []))


def cell_key(cond: dict[str, Any], shape: GemmShape, m_splits: Iterable[int] | None, precision: str,
             mode: str) -> str:
    """The cache key of a cell measured under ``cond`` (a run's device conditions). A CPU cell's
    key also names the CPU model and torch's thread count (timing.device_conditions): a CPU
    matmul's time depends on both, and "CPU (x86_64)" alone let one host's cells, or one thread
    count's, stand for another's. GPU keys are as before (device name, versions, mode, duty); a TE
    recipe's also carries a hash of the recipe's configuration and environment."""
    versions = f"torch {cond.get('torch')}, TE {cond.get('transformer_engine')}"
    # A TE recipe's cell is keyed on the recipe TE built and the NVTE_* variables that change it
    # (BenchRun records both): a cell timed without NVFP4's RHT must not stand for one with it.
    if precision != "BF16" and (tag := recipe_fingerprint((cond.get("recipe_config") or {}).get(precision),
                                                          cond.get("recipe_env"))):
        versions += f", recipe {tag}"
    device = cond.get("device", "?")
    if "cpu_threads" in cond:
        device = f"{device}, {cond.get('cpu_model') or 'unknown CPU model'}, {cond['cpu_threads']} threads"
    return result_key(device, versions, shape, tuple(m_splits) if m_splits else None,
                      precision, mode, bool(cond.get("flush_l2")), cond.get("gemm_duty", 1.0))


# Bumped when the timing changes what a cell measures; a cache written by another version is
# dropped on load. 2: every timed burst at the sustained clock (version 1, no field, timed many
# cells at the idle boost clock, fast against training; docs/benchmark-methodology.md).
# 3: jobs queued back to back, no synchronize between them. 4: each job built once and
# visited 16 times; timed GEMMs at a training step's duty (timing.GEMM_DUTY).
TIMING_VERSION = 4


CACHE_SCHEMA = "te-gemm-cache/1"


class ResultCache:
    """JSON cache of results and per-device peaks, so reports and reruns do not re-measure.

    Safe to share between processes: saving takes a file lock (``<cache>.lock``), reads what the
    file holds now, merges this run's cells into it and replaces it atomically, so two benches on
    one cache lose nothing. A file that is not a cache is refused at once (one line, nothing
    measured, the file untouched); a corrupt cache is moved aside with a warning; a cache that
    cannot be written is a warning (``save_error``), never a lost run.

    Only quiet cells are good: a cell marked noisy or with a spread above SPREAD_LIMIT is never
    stored, and an entry above it (written before the limit existed) is refused on lookup, so the
    cell is measured again, and dropped from the file on save unless a good one replaced it.
    A cell that comes from here says so (``BenchResult.cached``).
    """

    def __init__(self, path: str | Path | None = None, enabled: bool = True, read_only: bool = False,
                 lock_timeout_s: float = 60.0) -> None:
        env = os.environ.get("TE_GEMM_CACHE") or None  # set but empty: the default
        default = Path(env) if env else Path.home() / ".cache" / "te_gemm_callback" / "bench.json"
        # A quoted "~/..." reaches us unexpanded: without this it made a folder named "~".
        self.path = (Path(path) if path else default).expanduser()
        self.enabled = enabled
        self.read_only = read_only  # lookups only: a multi-GPU run's parts, whose caller stores the pooled cells
        # How long save() waits for another process's lock: inside a training job, no time at all
        # (the job's next step must not wait on someone else's bench; the cells are then not kept).
        self.lock_timeout_s = lock_timeout_s
        self.save_error: str | None = None
        self._new: dict[str, Any] = {}  # cells this run measured: what save() merges into the file
        self._new_modules: dict[str, Any] = {}  # module cost rows this run measured (microbench/module_cost.py)
        self.refused: set[str] = set()  # keys whose stored entry was too noisy to reuse: dropped on save
        self.data: dict[str, Any] = self._empty()
        if enabled:
            self.data = self._read(warn=True)

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"schema": CACHE_SCHEMA, "timing_version": TIMING_VERSION, "results": {}, "peaks": {}, "modules": {}}

    def version_path(self) -> Path:
        """Where this timing version keeps its cells when the cache file belongs to another
        version: a file of its own beside it, so that two installs sharing a cache keep theirs."""
        return self.path.with_name(f"{self.path.stem}.timing-{TIMING_VERSION}{self.path.suffix or '.json'}")

    def _read(self, warn: bool) -> dict[str, Any]:
        """The cache file's contents now (empty if absent, unreadable, corrupt or of an older timing).

        Whether a file is a cache is decided by its content: JSON with our schema (or an older
        cache's fields). Anything else (a checkpoint, a PNG, Latin-1 notes) is refused, never
        treated as "unreadable" and then written over."""
        p = self.path
        if not p.exists() or p.is_dir():  # a folder: save() says it cannot write there
            return self._empty()
        try:
            raw = read_bytes_bounded(p)
        except OSError as err:  # permissions: measure without it (save() cannot replace it either)
            if warn:
                log.warning("te-gemm: cache %s unreadable (%s): measuring without it", p, err.strerror or err)
            return self._empty()
        except ValueError as err:  # over the size limit, a device
            raise ValueError(f"{p} is not a te-gemm cache ({err}); {_ELSEWHERE}") from None
        try:
            data = parse_json(raw)
            sch = data.get("schema") if isinstance(data, dict) else None
            if isinstance(sch, str) and sch.startswith(CACHE_SCHEMA.split("/")[0] + "/") and sch != CACHE_SCHEMA:
                # Another install's cache format (a newer one): never called corrupt or moved; this
                # install keeps a file of its own beside it, as for another timing version.
                other = self.version_path()
                if warn:
                    log.info("te-gemm: cache %s is %s; this install (%s) uses %s", p, sch, CACHE_SCHEMA, other)
                self.path = other
                return self._read(warn) if other.exists() and other != p else self._empty()
            if not _is_cache(data):
                raise ValueError(f"{p} is not a te-gemm cache (it holds {schema_of(data) or type(data).__name__}); "
                                 + _ELSEWHERE)
            check(data, CACHE_FILE)
        except ValueError as err:
            if not _looks_like_cache(raw):  # not ours at all
                msg = str(err) if str(err).startswith(str(p)) else f"{p} is not a te-gemm cache ({err}); {_ELSEWHERE}"
                raise ValueError(msg) from None
            return self._move_aside(err)  # ours, torn or damaged by hand: it is only a cache
        if data.get("timing_version") != TIMING_VERSION:
            # Another install's cells (measured another way): never emptied or rewritten. This
            # version reads and writes a file of its own beside it.
            other = self.version_path()
            if warn:
                log.info("te-gemm: cache %s holds timing version %s; this one (%s) uses %s", p,
                         data.get("timing_version"), TIMING_VERSION, other)
            self.path = other
            return self._read(warn) if other.exists() and other != p else self._empty()
        data = {"schema": CACHE_SCHEMA, **{k: v for k, v in data.items() if k != "schema"}}  # schema first
        data.setdefault("results", {})
        data.setdefault("peaks", {})
        data.setdefault("modules", {})
        return data

    def _move_aside(self, why: Exception) -> dict[str, Any]:
        p = self.path
        aside = p.with_name(f"{p.name}.corrupt-{int(time.time())}")
        try:
            os.replace(p, aside)
            log.warning("te-gemm: cache %s was corrupt: moved aside to %s, starting empty (%s)", p, aside, why)
        except OSError:
            log.warning("te-gemm: cache %s is corrupt (%s) and could not be moved aside", p, why)
        return self._empty()

    def get(self, key: str) -> BenchResult | None:
        """The stored cell, marked ``cached``; None if absent or too noisy to reuse."""
        d = self.data["results"].get(key) if self.enabled else None
        if not d:
            return None
        try:
            check(d, BENCH_RESULT, f"results[{key!r}]")
        except ValueError as err:  # edited by hand: measured again, dropped on save
            log.warning("te-gemm: cache %s: %s: measuring that cell again", self.path, err)
            self.refused.add(key)
            return None
        r = from_fields(BenchResult, d)
        if _too_noisy(r):
            self.refused.add(key)
            return None
        r.cached = True
        return r

    def put(self, key: str, r: BenchResult) -> None:
        """Store a cell this run measured: failures are re-tried next time, noisy cells re-measured."""
        if not r.ok or self.read_only:
            return
        if _too_noisy(r):
            self.refused.add(key)  # an older entry under this key is no better: save() drops it
            return
        self.data["results"][key] = self._new[key] = asdict(r) | {"cached": False}

    def get_module(self, key: str) -> dict[str, Any] | None:
        """A stored module cost row (microbench/module_cost.py), or None."""
        d = self.data.get("modules", {}).get(key) if self.enabled else None
        return dict(d) if isinstance(d, dict) else None

    def put_module(self, key: str, row: dict[str, Any]) -> None:
        if not self.read_only:
            self.data.setdefault("modules", {})[key] = self._new_modules[key] = dict(row)

    def save(self) -> str | None:
        """Merge this run's cells into the file under a lock; returns (and logs) why it could not."""
        if not self.enabled or self.read_only:
            return None
        try:
            from filelock import FileLock, Timeout

            if self.path.is_dir():  # before the lock: a <folder>.lock beside it was left behind
                raise OSError(f"{self.path} is a folder: give --cache a file path")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with FileLock(f"{self.path}.lock", timeout=self.lock_timeout_s):
                    data = self._read(warn=False)
                    for key in self.refused - self._new.keys():  # heal: unless another process stored a good one
                        if (d := data["results"].get(key)) and not _usable(d):
                            del data["results"][key]
                    data["results"].update(self._new)
                    data["modules"].update(self._new_modules)
                    data["peaks"].update(self.data.get("peaks", {}))
                    write_json(self.path, data, indent=None, schema=CACHE_SCHEMA, accept=_is_cache)
            except Timeout:
                raise OSError(f"lock {self.path}.lock held by another process "
                              f"({self.lock_timeout_s:g} s waited)") from None
            self.data = data
            self._new = {}
            self._new_modules = {}
            self.save_error = None
        except (OSError, ValueError) as err:
            self.save_error = f"results not cached in {self.path}: {err}"
            log.warning("te-gemm: %s", self.save_error)
        return self.save_error


def _too_noisy(r: BenchResult) -> bool:
    return r.noisy or r.above_spread_limit


_ELSEWHERE = "give --cache a new path or set TE_GEMM_CACHE to one"


def _usable(d: dict[str, Any]) -> bool:
    """A stored entry that is well-formed and quiet enough to reuse."""
    try:
        check(d, BENCH_RESULT)
    except ValueError:
        return False
    return not _too_noisy(from_fields(BenchResult, d))


def _looks_like_cache(raw: bytes) -> bool:
    """A cache file torn or damaged after its first bytes still opens the way ours do: with our
    schema, the first field every cache we write has. Nothing else counts, however much it looks
    like one: an lm-eval results.json opens with '{"results"' too, and it is not ours to move."""
    return raw[:64].lstrip().startswith(b'{"schema": "' + CACHE_SCHEMA.split("/")[0].encode())


def _is_cache(data: Any) -> bool:
    return isinstance(data, dict) and (data.get("schema") == CACHE_SCHEMA or (
        "schema" not in data and "timing_version" in data and isinstance(data.get("results"), dict)))
