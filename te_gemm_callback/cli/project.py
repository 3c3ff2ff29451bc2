"""``te-gemm project``: a run folder's GEMMs projected onto another GPU (docs/projection.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from te_gemm_callback.printable import safe


def cmd_project(a: argparse.Namespace) -> int:
    from te_gemm_callback.files.jsonio import check_target, json_kind, write_json
    from te_gemm_callback.projection import PROJECTION_SCHEMA, check_run_folder, gpu, project_run
    from te_gemm_callback.reporting.projection_tables import projection_table
    from te_gemm_callback.reporting.tables import console

    path = Path(a.json or check_run_folder(a.run_dir) / f"projection-{gpu(a.gpu).key}.json")
    root = a.run_dir if a.json is None else None
    check_target(path, json_kind(PROJECTION_SCHEMA), root)  # refused before anything is printed
    rp = project_run(a.run_dir, a.gpu, a.source_gpu, host_speed=a.host_speed)
    out = console()
    out.print(projection_table(rp))
    write_json(path, rp.to_dict(), schema=PROJECTION_SCHEMA, root=root)
    where = "standard output" if str(path) == "-" else safe(path)
    out.print(f"projection: {where} (per-cell times, bands and their basis; method: docs/projection.md)")
    return 0


def _positive(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return x


def _gpu(text: str) -> str:
    from te_gemm_callback.projection import gpu

    try:
        return gpu(text).key
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_project_parser(command, dir_path, file_path) -> None:
    from te_gemm_callback.projection import GPUS

    s = command("project", "project a run folder's GEMMs and step onto another GPU (e.g. Hopper -> Blackwell)",
                "Scale each GEMM the run's bench measured (both modes) to another GPU by public peaks per format, "
                "add the quantization traffic each recipe costs at the target's bandwidth (MXFP8 and NVFP4 too, "
                "which Hopper cannot run), and replay the job's own step there (other kernels scaled by bandwidth, the "
                "host as measured, so a host-bound job stays host-bound); print the projected "
                "GEMM time per step, its band and the step speedups beside the source's, and write "
                "RUN_DIR/projection-GPU.json. Labelled 'projection'; on the GPU itself, the measured numbers. "
                "Method and validation: docs/projection.md. No GPU needed.")
    s.add_argument("run_dir", type=dir_path, help="a run folder with gemm_capture.json and bench.json (both modes)")
    s.add_argument("--gpu", required=True, type=_gpu, metavar="GPU",
                   help=f"the GPU to project onto: {', '.join(GPUS)} (any case)")
    s.add_argument("--source-gpu", type=_gpu, metavar="GPU",
                   help="the GPU the bench ran on, only where bench.json's device name is not recognised "
                        "(default: read from bench.json)")
    s.add_argument("--json", type=file_path, help="where to write (default: RUN_DIR/projection-GPU.json)")
    s.add_argument("--host-speed", type=_positive, default=1.0, metavar="X",
                   help="how many times faster the target's host (CPU, driver) runs the job's host side than the "
                        "measuring host did (default 1: as measured)")
    s.set_defaults(fn=cmd_project)


__all__ = ["cmd_project", "add_project_parser"]
