"""``te-gemm project``: a run folder's GEMMs projected onto another GPU (docs/projection.md). The projection
package loads torch: imported inside the functions, so that `import te_gemm_callback.cli` does not."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.cli.args import UsageError, _dir_path, _file_path, float_in, where
from te_gemm_callback.files.jsonio import check_target, json_kind, write_json
from te_gemm_callback.reporting.console import console, make_table
from te_gemm_callback.reporting.projection_tables import projection_table
from te_gemm_callback.reporting.run import Run

# Another host 100x slower or faster than the one measured: beyond, a typo.
_host_speed = partial(float_in, lo=0.01, hi=100.0, what="a factor")


def cmd_project(a: argparse.Namespace) -> int:
    from te_gemm_callback.projection import PROJECTION_SCHEMA, check_run_folder, gpu
    path = Path(a.json or check_run_folder(a.run_dir) / f"projection-{gpu(a.gpu).key}.json")
    root = a.run_dir if a.json is None else None
    check_target(path, json_kind(PROJECTION_SCHEMA), root)  # refused before anything is printed
    if (cpu := _cpu_capture(a.run_dir)) is not None:
        if a.source_gpu is not None:  # CPU times were projected as if the GPU's
            raise UsageError(f"--source-gpu {a.source_gpu}: {a.run_dir} ran on a CPU, whose times are no GPU's; "
                             "without --source-gpu te-gemm project gives a shape-only estimate")
        return _shape_only(a, cpu, path, root)
    rp = Run(a.run_dir).project(a.gpu, a.source_gpu, host_speed=a.host_speed)
    console().print(projection_table(rp))
    write_json(path, rp.to_dict(), schema=PROJECTION_SCHEMA, root=root)
    console().print(f"projection: {where(path)} (per-cell times, bands and their basis; method: docs/projection.md)")
    return 0


def _cpu_capture(run_dir: str) -> Any:
    """The capture of a run that ran on a CPU (no GPU measurement to project from), else None."""
    path = Path(run_dir) / "gemm_capture.json"
    cap = GemmCapture.load(path) if path.is_file() else None
    return cap if cap is not None and str(cap.meta.get("device", "")).startswith("CPU") else None


def _shape_only(a: argparse.Namespace, cap: Any, path: Path, root: str | None) -> int:
    """A CPU run's first estimate for the GPU: the captured GEMMs at its public peaks (no step)."""
    from te_gemm_callback.projection import PROJECTION_SCHEMA, gpu
    from te_gemm_callback.projection.shape_only import LABEL, shape_only
    est = shape_only(cap, gpu(a.gpu))
    rows = [[r, f"{ms:.4g}", "-" if (sp := est.speedup(r)) is None else f"{sp:.2f}x"] for r, ms in est.gemm_ms.items()]
    rows += [[r, "-", why] for r, why in est.skipped.items()]
    console().print(make_table(
        f"{est.target.name}: the captured GEMMs at its public peaks ({LABEL})",
        # "at least": a lower bound; "bound" alone names the host or GPU side everywhere else.
        ("recipe", "GEMM ms/step (at least)", "vs BF16"), left={"recipe"}, rows=rows,
        caption="a CPU run measured no GPU: each GEMM at the format's dense peak or its bytes at the HBM bandwidth, "
                "whichever is longer. A lower bound on GEMM time, not a prediction: real kernels stay below the peak "
                "(small ones far below), quantization and the rest of the step are not in it. Run on a GPU for "
                "measured cells and the step."))
    write_json(path, {"schema": PROJECTION_SCHEMA, **est.to_dict()}, schema=PROJECTION_SCHEMA, root=root)
    console().print(f"projection: {where(path)} ({LABEL})")
    return 0


def _gpu(text: str) -> str:
    from te_gemm_callback.projection import gpu
    try:
        return gpu(text).key
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _gpus(text: str) -> list[str]:
    gpus = list(dict.fromkeys(_gpu(g) for g in text.split(",") if g.strip()))  # each once
    if not gpus:
        raise argparse.ArgumentTypeError(f"expected GPU names, e.g. B300,GB200, got {text!r}")
    return gpus


def add_project_parser(command: Any) -> None:
    from te_gemm_callback.projection import GPUS
    s = command("project", cmd_project,
                "project a run folder's GEMMs and step onto another GPU (e.g. Hopper -> Blackwell)",
                "Scale a run's measured GEMMs and step to another GPU by its public peaks and bandwidth, print the "
                "projected times and speedups, and write RUN_DIR/projection-GPU.json: a projection, not a "
                "measurement. Method and validation: docs/projection.md. No GPU needed.")
    s.add_argument("run_dir", type=_dir_path, help="a run folder with gemm_capture.json and bench.json (both modes)")
    s.add_argument("--gpu", required=True, type=_gpu, metavar="GPU",
                   help=f"the GPU to project onto: {', '.join(GPUS)} (any case)")
    s.add_argument("--source-gpu", type=_gpu, metavar="GPU",
                   help="the GPU the bench ran on, if bench.json's device name is not recognised "
                        "(default: read from bench.json)")
    s.add_argument("--json", type=_file_path,
                   help="where to write the projection (default: RUN_DIR/projection-GPU.json)")
    s.add_argument("--host-speed", type=_host_speed, default=1.0, metavar="X",
                   help="the target host's speed (CPU, driver) relative to the measuring host's")

