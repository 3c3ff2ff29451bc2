"""``te-gemm cache list|clear``: what the microbenchmark result cache holds, and its removal. Both tell a cache by
its content, as the cache does: a file of another kind is named and left untouched."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import stat
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from te_gemm_callback.cli.args import EXIT_CODES, UsageError, _file_path
from te_gemm_callback.files.jsonio import parse_json, read_bytes_bounded, schema_of
from te_gemm_callback.microbench.cache import TIMING_VERSION, ResultCache, _is_cache, _looks_like_cache
from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import console, make_table


def cache_path(path: str | None) -> Path:
    """The file a bench with ``--cache path`` would use (disabled: the file is not read)."""
    return ResultCache(path, enabled=False).path


def _aside(path: Path) -> list[Path]:
    """The corrupt caches moved aside (``<name>.corrupt-<time>``) that open as ours (not what an old version moved)."""
    pattern = re.compile(re.escape(path.name) + r"\.corrupt-\d+")
    try:
        named = sorted(p for p in path.parent.iterdir()
                       if pattern.fullmatch(p.name) and p.is_file() and not p.is_symlink())
    except OSError:
        return []
    ours = []
    for p in named:
        with contextlib.suppress(OSError), open(p, "rb") as f:
            if _looks_like_cache(f.read(64)):
                ours.append(p)
    return ours


def _read_cache(path: Path) -> tuple[dict[str, Any] | None, int]:
    """The cache's content (None: torn mid-write, still ours) and size; ValueError for anything else."""
    if path.is_symlink():  # the cache never writes through a link; its removal must not either
        raise ValueError(f"{path} is a symbolic link (to {os.readlink(path)}), not a te-gemm cache: give the real path")
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file, so not a te-gemm cache")
    raw = read_bytes_bounded(path)
    try:
        data = parse_json(raw)
        why = None if _is_cache(data) else f"it holds {schema_of(data) or type(data).__name__}"
    except ValueError as err:
        why = str(err)
    if why is None:
        return data, st.st_size
    if _looks_like_cache(raw):
        return None, st.st_size
    raise ValueError(f"{path} is not a te-gemm cache ({why}); nothing was changed")


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def cell_counts(results: dict[str, Any]) -> Counter:
    """Cells per (device, versions, recipe), from microbench.cells.result_key's keys, else the entry's fields."""
    counts: Counter = Counter()
    for key, entry in results.items():
        parts = str(key).split("|")
        if len(parts) >= 7:
            # A bench without TE keys its cells "TE None": shown as the absence it is.
            device, versions, recipe = parts[0], parts[1].replace("TE None", "no TE"), parts[4]
        else:
            e = entry if isinstance(entry, dict) else {}
            cond = got if isinstance(got := e.get("conditions"), dict) else {}
            device, versions, recipe = str(cond.get("device", "?")), "?", str(e.get("precision", "?"))
        counts[(device, versions, recipe)] += 1
    return counts


def cmd_cache_list(a: argparse.Namespace) -> int:
    out = console()
    path = cache_path(a.cache)
    aside = _aside(path)
    out.print(f"cache: {safe(path)}")
    if not os.path.lexists(path):
        out.print("no cache yet: te-gemm bench writes one (--no-cache: measure without it)")
    else:
        data, size = _read_cache(path)
        if data is None:
            out.print(f"size: {_size(size)}; damaged (torn mid-write or edited): the next bench moves it aside and "
                      "starts empty")
        else:
            results = got if isinstance(got := data.get("results"), dict) else {}
            version = data.get("timing_version")
            out.print(f"size: {_size(size)}, {len(results)} cell(s), timing version {safe(version)}")
            if version != TIMING_VERSION:
                mine = ResultCache(a.cache, enabled=False).version_path()
                out.print(f"[yellow]written by another timing version (this one measures with {TIMING_VERSION}): "
                          f"kept as it is; this version keeps its cells in {safe(mine)}[/yellow]")
            counts = cell_counts(results)
            if counts:
                cols = ("device", "versions", "recipe", "cells")
                rows = [[safe(d), safe(v), safe(r), str(n)] for (d, v, r), n in sorted(counts.items())]
                out.print(make_table("cells per device and recipe", cols, left=cols[:3], wrap=cols, rows=rows))
            peaks = data.get("peaks") if isinstance(data.get("peaks"), dict) else {}
            if peaks:
                out.print("peak TFLOP/s measured on: " + safe(", ".join(map(str, peaks))))
    if aside:
        out.print(f"{len(aside)} damaged cache(s) moved aside: " + safe(", ".join(p.name for p in aside)))
    return 0


def cmd_cache_clear(a: argparse.Namespace) -> int:
    from filelock import FileLock, Timeout
    path = cache_path(a.cache)
    aside = _aside(path)
    exists = os.path.lexists(path)
    if not exists and not aside:
        print(f"nothing to clear: no cache at {safe(path)}")
        return 0
    what = []
    if exists:
        data, size = _read_cache(path)  # refuses a file that is not a cache before anything is asked
        cells = len(data["results"]) if data is not None and isinstance(data.get("results"), dict) else None
        what.append(f"{path} ({_size(size)}" + ("" if cells is None else f", {cells} cell(s)") + ")")
    what += [str(p) for p in aside]
    if not a.yes:
        if not sys.stdin.isatty():  # a script must say so: a prompt nobody sees would hang it
            raise UsageError(f"pass --yes to remove {'; '.join(what)} without a prompt")
        answer = input(f"remove {safe('; '.join(what))}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    if exists:
        try:
            # A bench saving now merges into the file under this lock: it finishes first, or saves after.
            with FileLock(f"{path}.lock", timeout=60):
                path.unlink()
        except Timeout:
            raise OSError(f"lock {path}.lock held by another process for 60 s: a bench is saving; try again") from None
    for p in aside:
        p.unlink()
    print(f"removed {safe('; '.join(what))}")
    return 0


def add_cache_parser(sub: Any) -> None:
    where = "the result cache file (default: $TE_GEMM_CACHE, else ~/.cache/te_gemm_callback/bench.json)"
    c = sub.add_parser("cache", help="list or clear the microbenchmark result cache",
                       description="The cells te-gemm bench measured, keyed by device, torch/TE versions, shape, "
                                   "recipe and conditions, so a rerun does not measure them again. "
                                   "Format: docs/capture-format.md.", epilog=EXIT_CODES)
    cs = c.add_subparsers(dest="cache_cmd", required=True, metavar="{list,clear}")
    s = cs.add_parser("list", help="where the cache is, its size, and its cells per device and recipe",
                      description="Show where the cache is, its size, and its cells per device (with torch/TE "
                                  "versions) and recipe. Changes nothing.", epilog=EXIT_CODES)
    s.add_argument("--cache", type=_file_path, help=where)
    s.set_defaults(fn=cmd_cache_list)
    s = cs.add_parser("clear", help="remove the cache (every cell is measured again next time)",
                      description="Remove the cache file and the damaged copies it moved aside, under its lock. "
                                  "A file that is not a te-gemm cache is refused and left as it is.", epilog=EXIT_CODES)
    s.add_argument("--cache", type=_file_path, help=where)
    s.add_argument("-y", "--yes", action="store_true", help="remove without asking (needed when not on a terminal)")
    s.set_defaults(fn=cmd_cache_clear)
