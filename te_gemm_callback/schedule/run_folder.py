"""What a job's capture writes into its run folder: the capture, every rank's, and the removal of
an earlier run's sweep captures that this run's report would otherwise take for its own."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.capture_file import SCHEMA
from te_gemm_callback.capture.distributed import RANKS_SCHEMA, rank_summary
from te_gemm_callback.files.jsonio import read_json, write_json

log = logging.getLogger("te_gemm_callback")


def new_run_id() -> str:
    """The id a run folder's captures share (the job's and its sweep's): ``meta["run_id"]``."""
    return uuid.uuid4().hex


def clear_stale_sweep(output_dir: Path, run_id: str) -> list[Path]:
    """Remove our captures in ``output_dir/sweep/`` whose run id is not ``run_id``, then the folders
    that leaves empty. Files that are not our captures, and links, are left alone."""
    sweep, gone = output_dir / "sweep", list[Path]()
    if not sweep.is_dir() or sweep.is_symlink():
        return gone
    root = output_dir.resolve()
    for p in sorted(sweep.glob("*/gemm_capture.json")):
        # glob follows a linked subfolder: never delete through a link, nor outside output_dir.
        if p.parent.is_symlink() or p.is_symlink() or not p.is_file() or not p.resolve().is_relative_to(root):
            continue
        try:
            data = read_json(p)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and \
                (data.get("meta") or {}).get("run_id") != run_id:
            p.unlink()
            gone.append(p)
    for d in [*{p.parent for p in gone}, sweep]:
        try:
            d.rmdir()  # only when empty: anything else of the user's stays
        except OSError:
            pass
    if gone:
        log.warning("te-gemm: removed %d sweep capture(s) of an earlier run from %s: this run's report must not "
                    "take them for its own", len(gone), sweep)
    return gone


def save_capture(cap: GemmCapture, output_dir: Path, filename: str, *, keep_existing: bool = False) -> Path:
    """Write the capture; with ``keep_existing`` (a resumed job), one already at the path stays and
    this one goes beside it, named after its last step."""
    path = output_dir / filename
    if keep_existing and path.exists():
        path = path.with_name(f"{path.stem}.step{cap.meta.get('global_step_end', 'resumed')}{path.suffix}")
        log.warning("te-gemm: %s exists from before the resume: this capture goes to %s", output_dir / filename, path)
    return cap.save(path)


def write_ranks(caps: list[GemmCapture], output_dir: Path) -> list[dict[str, Any]]:
    """Every rank's capture and the per-rank summary under ``output_dir/ranks/``."""
    for c in caps:
        c.save(output_dir / "ranks" / f"rank{c.meta.get('rank')}.json", root=output_dir)  # ranks/ a link: refused
    summary = rank_summary(caps)
    write_json(output_dir / "ranks" / "summary.json", {"schema": RANKS_SCHEMA, "ranks": summary},
               schema=RANKS_SCHEMA, root=output_dir)
    return summary
