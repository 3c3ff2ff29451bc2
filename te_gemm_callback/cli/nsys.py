"""``te-gemm nsys``: a capture's GEMM times beside Nsight Systems' own for the same run (docs/nsight-systems.md).
analysis.nsys loads torch: imported inside cmd_nsys, so that `import te_gemm_callback.cli` does not."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.cli.args import UsageError, _file_path, _limit, more_rows_hint
from te_gemm_callback.files.jsonio import check_target, json_kind, write_json
from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import console
from te_gemm_callback.reporting.nsys_table import nsys_table


def cmd_nsys(a: argparse.Namespace) -> int:
    from te_gemm_callback.analysis import nsys as ns
    if a.json:
        check_target(a.json, json_kind(ns.NSYS_SCHEMA))  # refused before nsys runs
    if a.nsys is not None and not Path(a.nsys).is_file():
        raise UsageError(f"--nsys {a.nsys}: {'a folder' if Path(a.nsys).is_dir() else 'no such file'}; "
                         "give the nsys binary")
    cap = GemmCapture.load(a.capture)
    rep = Path(a.report)
    if rep.is_dir():  # it exists: "No such file" sent the user looking for a typo
        raise ValueError(f"{rep} is a folder: give nsys's report file (.nsys-rep or .sqlite)")
    if not rep.is_file():
        raise FileNotFoundError(2, "No such file", str(rep))
    nsys = ns.find_nsys(a.nsys)
    if nsys is None:
        raise ValueError("no nsys found on PATH or under /opt/nvidia: pass --nsys PATH")
    try:
        cmp = ns.against_capture(cap, rep, nsys, a.pid)
    except ns.UsageError as err:
        raise UsageError(str(err)) from None
    out = console()
    if not (cap.meta.get("cupti_owner") or "").startswith("Nsight Systems"):
        out.print(f"[yellow]this capture was not taken under nsys (its GEMM times: "
                  f"{safe(cap.meta.get('gemm_time_source', '?'))}): they come from another run than the report's")
    out.print(nsys_table(cmp, limit=a.limit))
    more_rows_hint(out, len(cmp.rows), a.limit)
    if a.json:
        write_json(a.json, cmp.to_dict(), schema=ns.NSYS_SCHEMA)
        out.print(f"comparison: {safe(a.json)}")
    return 0


def _pid(text: str) -> str:
    # A process id is a whole number: "abc" failed later with an error that named something else.
    if not text.strip().isascii() or not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a process id (a whole number), got {text!r}")
    return text.strip()


def add_nsys_parser(command: Any) -> None:
    s = command("nsys", cmd_nsys, "set a capture's GEMM times beside nsys's own for the same run (needs nsys)",
                "Print each GEMM's time in a capture beside nsys's kernel time for its NVTX range, medians over the "
                "same steps, for a job run under nsys profile -t cuda,nvtx. Needs nsys, no GPU. "
                "How: docs/nsight-systems.md.")
    s.add_argument("capture", type=_file_path, help="the job's gemm_capture.json")
    s.add_argument("report", type=_file_path, help="the .nsys-rep nsys wrote for that job")
    s.add_argument("--nsys", type=_file_path, help="the nsys binary (default: PATH, then /opt/nvidia)")
    s.add_argument("--pid", type=_pid, help="the process that wrote CAPTURE, if REPORT holds several (one per rank) "
                                            "(default: the only one)")
    s.add_argument("--json", type=_file_path, help="also write the rows as JSON (capture_vs_nsys as a fraction)")
    s.add_argument("--limit", type=_limit, default=None, help="rows to print, 0 for all (default: 0, every row)")

