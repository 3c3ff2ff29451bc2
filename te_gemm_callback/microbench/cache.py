"""The microbenchmarks' cache: measured cells and per-device peaks kept between runs, shared between
processes under a file lock; noisy cells and another timing's files are never reused."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

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
from te_gemm_callback.microbench.cells import BenchResult

log = logging.getLogger("te_gemm_callback")

# Bumped when the timing changes what a cell measures; another version's cache is kept apart.
TIMING_VERSION = 4

CACHE_SCHEMA = "te-gemm-cache/1"

_ELSEWHERE = "give --cache a new path or set TE_GEMM_CACHE to one"


class ResultCache:
    """JSON cache of results and per-device peaks; saving merges this run's cells into the file under
    ``<cache>.lock``. A file that is not a cache is refused, a corrupt one moved aside, an unwritable
    one a warning (``save_error``)."""

    def __init__(self, path: str | Path | None = None, enabled: bool = True, read_only: bool = False,
                 lock_timeout_s: float = 60.0) -> None:
        env = os.environ.get("TE_GEMM_CACHE") or None  # set but empty: the default
        default = Path(env) if env else Path.home() / ".cache" / "te_gemm_callback" / "bench.json"
        self.path = (Path(path) if path else default).expanduser()  # a quoted "~/..." made a folder "~"
        self.enabled = enabled
        self.read_only = read_only  # a multi-GPU run's parts: the caller stores the pooled cells
        # save()'s wait for another process's lock: 0 inside a training job, whose next step must not wait.
        self.lock_timeout_s = lock_timeout_s
        self.save_error: str | None = None
        self._new: dict[str, Any] = {}  # cells this run measured: what save() merges into the file
        self._new_modules: dict[str, Any] = {}  # module cost rows this run measured
        self.refused: set[str] = set()  # keys whose stored entry was too noisy to reuse: dropped on save
        self.data: dict[str, Any] = self._read(warn=True) if enabled else self._empty()

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"schema": CACHE_SCHEMA, "timing_version": TIMING_VERSION, "results": {}, "peaks": {}, "modules": {}}

    def version_path(self) -> Path:
        """This timing version's own file beside a cache of another version or format."""
        return self.path.with_name(f"{self.path.stem}.timing-{TIMING_VERSION}{self.path.suffix or '.json'}")

    def _read(self, warn: bool) -> dict[str, Any]:
        """The file's contents now (empty if absent, unreadable, corrupt or of another timing)."""
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
                return self._elsewhere(warn, f"is {sch}; this install ({CACHE_SCHEMA}) uses")
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
            return self._elsewhere(warn, f"holds timing version {data.get('timing_version')}; "
                                         f"this one ({TIMING_VERSION}) uses")
        data = {"schema": CACHE_SCHEMA, **{k: v for k, v in data.items() if k != "schema"}}  # schema first
        for k in ("results", "peaks", "modules"):
            data.setdefault(k, {})
        return data

    def _elsewhere(self, warn: bool, what: str) -> dict[str, Any]:
        """Another install's cache (format or timing) is left alone: use a file of our own beside it."""
        p, other = self.path, self.version_path()
        if warn:
            log.info("te-gemm: cache %s %s %s", p, what, other)
        self.path = other
        return self._read(warn) if other.exists() and other != p else self._empty()

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
            self.data, self._new, self._new_modules, self.save_error = data, {}, {}, None
        except (OSError, ValueError) as err:
            self.save_error = f"results not cached in {self.path}: {err}"
            log.warning("te-gemm: %s", self.save_error)
        return self.save_error


def _too_noisy(r: BenchResult) -> bool:
    return r.noisy or r.above_spread_limit


def _usable(d: dict[str, Any]) -> bool:
    """A stored entry that is well-formed and quiet enough to reuse."""
    try:
        check(d, BENCH_RESULT)
    except ValueError:
        return False
    return not _too_noisy(from_fields(BenchResult, d))


def _looks_like_cache(raw: bytes) -> bool:
    """A torn or damaged cache still opens with our schema, the first field we write (an lm-eval
    results.json opens with '{"results"' too, and it is not ours to move)."""
    return raw[:64].lstrip().startswith(b'{"schema": "' + CACHE_SCHEMA.split("/")[0].encode())


def _is_cache(data: Any) -> bool:
    return isinstance(data, dict) and (data.get("schema") == CACHE_SCHEMA or (
        "schema" not in data and "timing_version" in data and isinstance(data.get("results"), dict)))
