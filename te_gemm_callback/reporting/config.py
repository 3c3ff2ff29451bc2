"""Where and how a run is published (:class:`ReportConfig`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_gemm_callback.options import Options, one_of, option, switch
from te_gemm_callback.printable import plain


def _output_dir(v: Any, name: str) -> Path:
    # Checked up front: a bad folder lost the capture at the end of training.
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise ValueError(f"{name} must be a folder path (default 'te_gemm'), got {v!r}")
    if "\x00" in str(v):
        raise ValueError(f"{name} must not hold a NUL character, got {v!r}")
    if os.path.exists(v) and not os.path.isdir(v):
        raise ValueError(f"{name} {plain(v)} exists and is not a folder: give a folder path")
    return Path(v)


def _filename(v: Any, name: str) -> str:
    # "." and ".." pass the name test but name a folder.
    if not isinstance(v, str) or not v.strip() or Path(v).name != v or v in (".", "..") or not v.isprintable():
        raise ValueError(f"{name} must be a plain file name such as 'gemm_capture.json', got {v!r}")
    if len(os.fsencode(v)) > 200:  # the folder's limit is 255 bytes, and ".name.xxxx.tmp" goes beside it
        raise ValueError(f"{name} must be at most 200 bytes, got {len(os.fsencode(v))}")
    return v


def _project(v: Any, name: str) -> tuple[str, ...]:
    from te_gemm_callback.projection import gpu  # loads torch: not at the options' import
    if isinstance(v, str):
        v = (v,)
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{name} must be a list of GPU names such as ('B300',), got {v!r}")
    try:
        return tuple(gpu(str(g)).key for g in v)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


@dataclass(frozen=True)
class ReportConfig(Options):
    """The run folder and the report the schedule writes into it."""
    output_dir: Path = option("te_gemm", "where filename is written (rank zero; every rank's under ranks/), "
                                               "and the report beside it.", _output_dir)
    filename: str = option("gemm_capture.json", "the capture's file name in output_dir.", _filename)
    report: bool | str = option(True, "True: right after the capture (and the sweep), benchmark the captured shapes "
                                      "in every recipe this machine runs and write the report (report.json, "
                                      "report.md, figures, trace) into output_dir on rank zero, its cost stated in "
                                      "the log, its files and metrics handed to the job's logger; 'end': the same "
                                      "when training ends (a multi-process job always reports then: no rank waits "
                                      "for rank zero's bench mid-training); False: neither (te-gemm bench and "
                                      "te-gemm report later).", one_of(True, False, "end"))
    project: Sequence[str] = option((), "GPUs to project the run onto in that report (('B300',); B200, GB200, "
                                        "H100...): a section of report.md each, labelled projection (te-gemm "
                                        "project, docs/projection.md).", _project)
    verbose: bool = option(False, "print the full tables (the capture, the benchmarks, the report) into the job's "
                                  "output; by default the log gets the report's summary, at most 25 lines "
                                  "(report.md and the logger get everything either way).", switch)
