"""A `te-gemm bench --devices 2` run on CPU workers, started and waited for until its worker runs."""

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def start_bench_with_workers(tmp: Path, argv_head: list[str]) -> tuple[subprocess.Popen, list[int]]:
    """Start ``argv_head + bench ...`` (40 shapes, BF16, 2 devices) with ``tmp`` as TMPDIR; return the
    process and its worker pids once a worker holds its spec (so a signal lands mid-run)."""
    shapes = ",".join(f"{64 + 8 * i}x{64 + 8 * i}x{64 + 8 * i}" for i in range(40))
    # Two visible GPUs as te-gemm counts them (it refuses more devices than that); a CPU build of
    # torch reads nothing of it, so the workers are CPU processes.
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="0,1")
    proc = subprocess.Popen(argv_head + ["bench", "--shapes", shapes, "--precisions", "BF16", "--devices", "2",
                                         "--no-cache", "--visits", "16"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp.glob("te_gemm_bench_*/spec1.json")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the worker is running
    workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]
    return proc, workers


def ddp_env(**extra: str) -> dict[str, str]:
    """The environment of a spawned multi-process job: a rendezvous port free now, not a fixed one that
    another job on this machine (a second test run, a lingering rank) may hold."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra)
