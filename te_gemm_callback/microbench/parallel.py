"""Spread a microbenchmark over several local GPUs: every GPU runs every job in the same order for its
share of the visits (a GEMM's clock depends on the work around it: docs/multi-gpu.md), and each cell's
samples are pooled. Device 0's share runs here, every other in a fresh interpreter
(``python -m ...microbench.parallel SPEC OUT``), started before this process imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_gemm_callback.files.jsonio import read_json
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import MAX_VISITS, MIN_GEMM_DUTY, MODES, BenchResult, cell_key
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.precisions import canonical
from te_gemm_callback.shapes import GemmOp, GemmShape

# results and the engine load torch: imported inside the functions, once the workers have started.

if TYPE_CHECKING:
    from te_gemm_callback.microbench.results import BenchResults


def local_gpu_count() -> int:
    """Visible GPUs without importing torch: CUDA_VISIBLE_DEVICES, else ``nvidia-smi -L``, else 1."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return max(1, len([d for d in visible.split(",") if d.strip()]))
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 1
    return max(1, sum(line.startswith("GPU ") for line in out.splitlines()))


def visit_shares(visits: int, devices: int) -> list[int]:
    """Visits per device, as even as they go (the first take the remainder); none: not used."""
    return [s for d in range(devices) if (s := visits // devices + (d < visits % devices))]


def _item_to_json(it: WorkItem) -> list:
    s = it.fprop
    return [it.name, s.m, s.k, s.n, str(s.op), s.batch, it.count, list(it.m_splits) if it.m_splits else None,
            it.weight, [[str(op), calls] for op, calls in it.passes]]


def _item_from_json(row: list) -> WorkItem:
    name, m, k, n, op, batch, count, splits, weight, passes = row
    return WorkItem(name, GemmShape(m, k, n, GemmOp(op), batch), count, tuple(splits) if splits else None, weight,
                    tuple((GemmOp(o), c) for o, c in passes))


@contextlib.contextmanager
def _sigterm_as_interrupt(stop: Any) -> Iterator[None]:
    """SIGTERM and SIGHUP (unless ignored) handled as Ctrl-C: ``stop()`` kills the workers in the
    handler, then the run unwinds. After a SIGKILL the workers die by themselves (:func:`_die_with_parent`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    got: list[int] = []

    def interrupt(signum: int, frame: Any) -> None:
        got.append(signum)
        stop()
        raise KeyboardInterrupt(f"signal {signum}")

    sigs = [signal.SIGTERM]
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    old = {sig: signal.signal(sig, interrupt) for sig in sigs}
    try:
        yield
    except BaseException as err:
        if got and not isinstance(err, KeyboardInterrupt):  # the signal, not what it broke, ends the run
            raise KeyboardInterrupt(f"signal {got[0]}") from err
        raise
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:  # the handler's KeyboardInterrupt was swallowed ("Exception ignored" in a callback)
        raise KeyboardInterrupt(f"signal {got[0]}")


_TMP_PREFIX = "te_gemm_bench_"


def _remove_stale_folders() -> None:
    """Remove this user's ``te_gemm_bench_<pid>_*`` folders whose process on this host is dead (a
    SIGKILLed parent cannot remove its own); a run in another PID namespace sharing /tmp looks dead."""
    host = socket.gethostname()
    try:
        folders = list(Path(tempfile.gettempdir()).glob(_TMP_PREFIX + "*"))
    except OSError:
        return
    for folder in folders:
        name = re.fullmatch(re.escape(_TMP_PREFIX) + r"(\d+)_\w+", folder.name)
        if not name:  # an older version's folder names no pid: leave it
            continue
        pid = int(name.group(1))
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            owner = folder / "owner"  # absent if the owner died right after creating the folder
            if owner.exists() and owner.read_text().split()[:1] != [host]:
                continue
        except OSError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the pid now
        return True
    return True


def _die_with_parent(parent: int, folder: Path) -> None:
    """In a worker: die when the caller dies, SIGKILL included (PR_SET_PDEATHSIG on Linux, and a thread
    that polls the parent pid and removes the temporary folder before exiting)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    if os.getppid() != parent:  # the parent died before the prctl: nobody to report to
        watch()
    threading.Thread(target=watch, name="te-gemm-parent-watch", daemon=True).start()


def _launch(device: int, spec: dict[str, Any], tmp: Path) -> tuple[subprocess.Popen, Path, Path]:
    spec_path, out_path, log_path = tmp / f"spec{device}.json", tmp / f"out{device}.json", tmp / f"log{device}.txt"
    spec_path.write_text(json.dumps(dict(spec, device=device)))
    # The worker imports this package from where this process found it (maybe a checkout).
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    with open(log_path, "w") as log:  # the child holds its own handle
        proc = subprocess.Popen([sys.executable, "-m", "te_gemm_callback.microbench.parallel", str(spec_path),
                                 str(out_path), str(os.getpid())], stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path))
    return proc, out_path, log_path


def run_bench_parallel(items: list[WorkItem], precisions: list[str], modes: list[str], devices: int, *,
                       flush_l2: bool = False, cache: ResultCache | None = None,
                       visits: int | None = None, gemm_duty: float | None = None, progress: bool = False,
                       console: Any = None) -> BenchResults:
    """``run_bench`` over ``devices`` local GPUs, the visits split between them, samples pooled."""
    _check_parallel(devices, visits, gemm_duty)
    _remove_stale_folders()
    if visits is not None:  # fewer visits than devices: the extra devices would have nothing to do
        devices = min(devices, visits)
    t0 = time.perf_counter()
    precisions = list(dict.fromkeys(canonical(p) for p in precisions))
    modes = [m for m in MODES if m in set(modes)]
    unique = list(dict.fromkeys(items))
    cache = cache or ResultCache(enabled=False)
    spec = {"items": [_item_to_json(it) for it in unique], "precisions": precisions, "modes": modes,
            "flush_l2": flush_l2, "visits": visits, "gemm_duty": gemm_duty, "devices": devices,
            "cache": str(cache.path) if cache.enabled else None}
    workers: list[tuple] = []

    def stop_workers() -> None:
        for _, proc, _, _ in workers:
            if proc.poll() is None:
                proc.kill()
        for _, proc, _, _ in workers:
            proc.wait()

    with _sigterm_as_interrupt(stop_workers), \
            tempfile.TemporaryDirectory(prefix=f"{_TMP_PREFIX}{os.getpid()}_") as tmp:
        try:
            # Who may remove it if we die (_remove_stale_folders).
            (Path(tmp) / "owner").write_text(f"{socket.gethostname()} {os.getpid()}")
            workers += [(d, *_launch(d, spec, Path(tmp))) for d in range(1, devices)]
            own = _own_share(unique, spec, progress, console)
            parts, failed = [own], {}
            for d, proc, out_path, log_path in workers:
                if not own.samples and proc.poll() is None:
                    proc.terminate()  # every cell was cached here, so in the worker too: nothing to wait for
                rc = proc.wait()
                if rc == 0 and out_path.exists():
                    parts.append(_part_from_json(read_json(out_path, "bench worker output")))
                elif own.samples:
                    tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
                    failed[d] = f"exit {rc}: {tail[0][:200] if tail else 'no output'}"
        except BaseException:  # an error, Ctrl-C or SIGTERM anywhere: no worker outlives the caller
            stop_workers()
            raise
    return _pooled(parts, own, cache, failed, t0)


def _check_parallel(devices: int, visits: int | None, gemm_duty: float | None) -> None:
    """The arguments, checked before any worker starts (two processes allowed on a CPU host)."""
    if devices < 1:
        raise ValueError("--devices must be >= 1")
    if devices > max(2, local_gpu_count()):
        raise ValueError(f"--devices {devices}, but this host has {local_gpu_count()} visible GPU(s) "
                         "(CUDA_VISIBLE_DEVICES, else nvidia-smi -L): pass at most that many")
    if visits is not None and (type(visits) is not int or not 1 <= visits <= MAX_VISITS):
        raise ValueError(f"visits must be an integer from 1 to {MAX_VISITS}, got {visits!r}")
    if gemm_duty is not None and not MIN_GEMM_DUTY <= gemm_duty <= 1.0:  # before the workers start, not in them
        raise ValueError(f"gemm_duty must be in [{MIN_GEMM_DUTY:g}, 1], got {gemm_duty}")


def _pooled(parts: list[Any], own: Any, cache: ResultCache, failed: dict[int, str], t0: float) -> BenchResults:
    """Every device's samples pooled per cell, the measured cells cached, and meta per device."""
    from te_gemm_callback.microbench.results import BenchResults, pool_parts
    results = pool_parts([p for p in parts if p.results])
    if own.samples:
        for r in results:
            if r.ok and r.cell in own.samples:
                cache.put(cell_key(r.conditions, r.shape, r.m_splits, r.precision, r.mode), r)
        cache.save()
    used = [p for p in parts if p.samples]
    per_device = {"devices": "device", "device_indices": "device_index", "visits_per_device": "visits",
                  "worker_wall_s": "wall_s", "worker_timeline_s": "timeline_s",
                  "clocks_per_device": "clocks_during_run"}
    meta: dict[str, Any] = dict(own.meta, wall_s=time.perf_counter() - t0,
                                samples_per_device=[sum(len(ts) for ts, _ in p.samples.values()) for p in used])
    meta.update({k: [p.meta.get(field) for p in used] for k, field in per_device.items()})
    if used:
        meta["visits"] = sum(meta["visits_per_device"])
    if failed:  # their visits are missing; the cells stand on the other GPUs' samples
        meta["failed_devices"] = failed
    if len(set(meta["devices"])) > 1:
        meta["mixed_devices"] = "the GPUs differ; each cell pools samples from all of them"
    return BenchResults(results, own.skipped, meta)


def _own_share(items: list[WorkItem], spec: dict[str, Any], progress: bool, console: Any) -> BenchResults:
    """Device 0's share, in this process, once the workers have started."""
    import torch

    if torch.cuda.is_available() and spec["devices"] > torch.cuda.device_count():
        raise ValueError(f"--devices {spec['devices']}, but this host has {torch.cuda.device_count()} visible GPU(s) "
                         "(CUDA_VISIBLE_DEVICES counts): pass at most that many")
    own = _run_share(items, dict(spec, device=0), progress, console)
    assert own is not None  # device 0 always has a visit (visit_shares)
    return own


def _run_share(items: list[WorkItem], spec: dict[str, Any], progress: bool = False,
               console: Any = None) -> BenchResults | None:
    """Device ``spec["device"]``'s share of the visits (None if it has none), the cache read only."""
    import torch

    from te_gemm_callback.microbench.engine import default_visits, run_bench
    total = spec["visits"] or default_visits(torch.cuda.is_available())
    shares = visit_shares(total, spec["devices"])
    if spec["device"] >= len(shares):
        return None
    cache = ResultCache(spec["cache"], read_only=True) if spec["cache"] else ResultCache(enabled=False)
    res = run_bench(items, spec["precisions"], spec["modes"], flush_l2=spec["flush_l2"], cache=cache,
                    progress=progress, console=console, visits=shares[spec["device"]], visits_of=total,
                    gemm_duty=spec["gemm_duty"])
    res.meta["device_index"] = spec["device"]
    return res


def _part_from_json(d: dict[str, Any]) -> BenchResults:
    from te_gemm_callback.microbench.results import BenchResults
    samples = {tuple(tuple(x) if isinstance(x, list) else x for x in cell): (ts, cs) for cell, ts, cs in d["samples"]}
    return BenchResults([BenchResult(**r) for r in d["results"]], d["skipped"], d["meta"], samples)


def _worker_main(spec_path: str, out_path: str, parent: str | None = None) -> int:
    if parent is not None:
        _die_with_parent(int(parent), Path(spec_path).parent)
    spec = json.loads(Path(spec_path).read_text())
    import torch
    if torch.cuda.is_available():
        torch.cuda.set_device(spec["device"])
    from te_gemm_callback.microbench.results import BenchResults
    res = _run_share([_item_from_json(row) for row in spec["items"]], spec)
    if res is None:  # fewer visits than devices (the CPU's default is one): nothing for this one
        res = BenchResults([])
    samples = [[list(cell), ts, cs] for cell, (ts, cs) in res.samples.items()]
    Path(out_path).write_text(json.dumps(dict(res.to_dict(), samples=samples)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(*sys.argv[1:4]))
