"""The report in the training job's own logger: scalars to every logger, figures and verdicts where one takes
them. No logger library the job did not load is imported (Hugging Face ``report_to``: through ``sys.modules``)."""

from __future__ import annotations

import contextlib
import html
import logging
import os
import sys
from pathlib import Path
from typing import Any

from te_gemm_callback.files.jsonio import read_json

log = logging.getLogger("te_gemm_callback")

FIGURES = ("speedups", "step_split", "gemm_autocast", "gemm_prequantized")  # write_run's keys for PNGs


def report_metrics(files: dict[str, Path]) -> dict[str, float]:
    """Scalars from the report: precision-aware MFU, per recipe the GEMM and predicted step speedups."""
    rep = read_json(files["report"])
    out: dict[str, float] = {}
    for recipe, v in ((rep.get("meta") or {}).get("mfu") or {}).items():
        if isinstance(v, (int, float)):
            out[f"te_gemm/report/mfu/{recipe}"] = float(v)
    for r in rep.get("recipes", []):
        for key in ("gemm_speedup", "predicted_step_speedup"):
            if isinstance(r.get(key), (int, float)):
                out[f"te_gemm/report/{key}/{r['recipe']}"] = float(r[key])
    return out


def verdict_markdown(files: dict[str, Path]) -> str:
    """The verdicts and tables as Markdown: the report.md the report wrote."""
    md = files.get("report_md")
    return Path(md).read_text() if md is not None and Path(md).is_file() else ""


def _figures(files: dict[str, Path]) -> list[tuple[str, Path]]:
    return [(f"te_gemm/{k}", Path(files[k])) for k in FIGURES if k in files and Path(files[k]).is_file()]


def _files(files: dict[str, Path]) -> list[str]:
    return [str(p) for p in files.values() if Path(p).is_file()]


def _image(path: Path) -> Any:
    """A PNG as an HxWxC uint8 array (TensorBoard's add_image)."""
    import matplotlib.image
    img = matplotlib.image.imread(str(path))
    return (img[..., :3] * 255).astype("uint8") if img.dtype != "uint8" else img[..., :3]


def to_tensorboard(writer: Any, files: dict[str, Path], step: int) -> None:
    for tag, path in _figures(files):
        writer.add_image(tag, _image(path), step, dataformats="HWC")
    writer.add_text("te_gemm/report", verdict_markdown(files), step)
    writer.flush()


def to_lightning_logger(logger: Any, files: dict[str, Path], step: int) -> None:
    """Figures and the verdict table to one Lightning logger, by its kind (metrics went through log_metrics)."""
    kind = type(logger).__name__
    if kind == "TensorBoardLogger":
        to_tensorboard(logger.experiment, files, step)
    elif kind == "WandbLogger":
        figs = _figures(files)
        if figs:
            logger.log_image(key="te_gemm/figures", images=[str(p) for _, p in figs], step=step,
                             caption=[t.split("/")[-1] for t, _ in figs])
        logger.log_text(key="te_gemm/report", columns=["report"], data=[[verdict_markdown(files)]], step=step)
    elif kind == "MLFlowLogger":
        for path in _files(files):
            logger.experiment.log_artifact(logger.run_id, path, artifact_path="te_gemm")


def hf_logging_dir(args: Any, since: float | None = None) -> str:
    """Where the Trainer's TensorBoard writes: the env or ``args.logging_dir``, the newest ``output_dir/runs/*`` with
    an event file made since ``since``, else ``runs/<time>_<host>_te_gemm`` (never a folder two jobs share)."""
    env = os.getenv("TENSORBOARD_LOGGING_DIR") or getattr(args, "logging_dir", None)
    if env:
        return env
    runs = Path(args.output_dir) / "runs"
    if since is not None and runs.is_dir():
        made = []
        for d in runs.iterdir():
            for f in d.glob("events.out.tfevents.*") if d.is_dir() else ():
                with contextlib.suppress(OSError):  # a dangling link, a file removed meanwhile: not the new run
                    if (t := f.stat().st_mtime) >= since:
                        made.append((t, f.parent))
        if made:
            return str(max(made)[1])
    import socket
    from datetime import datetime
    return str(runs / f"{datetime.now().strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}_te_gemm")


def to_report_to(report_to: Any, logging_dir: str | None, metrics: dict[str, float], files: dict[str, Path],
                 step: int) -> list[str]:
    """Metrics, figures and verdicts to each ``TrainingArguments.report_to`` integration; returns those reached."""
    targets = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in targets:
        targets = ["tensorboard", "wandb", "mlflow"]
    reached = []
    if "tensorboard" in targets and logging_dir:
        try:
            from torch.utils.tensorboard import SummaryWriter  # the Trainer's own TensorBoard integration uses it
        except ImportError:
            pass
        else:  # a writer of our own in the Trainer's logging_dir: TensorBoard reads every event file there
            writer = SummaryWriter(log_dir=logging_dir)
            try:
                for k, v in metrics.items():
                    writer.add_scalar(k, v, step)
                if files:
                    to_tensorboard(writer, files, step)
            finally:
                writer.close()
            reached.append("tensorboard")
    wandb = sys.modules.get("wandb")
    if "wandb" in targets and wandb is not None and getattr(wandb, "run", None) is not None:
        payload: dict[str, Any] = {**metrics, **{tag: wandb.Image(str(p)) for tag, p in _figures(files)}}
        if files:  # escaped: a "<script>" in a module name must reach the panel as text
            payload["te_gemm/report"] = wandb.Html(f"<pre>{html.escape(verdict_markdown(files))}</pre>")
        # Into the job's next row (or a row of its own at the run's end): a row or a step of ours would
        # move W&B's row counter, which numbers the job's later rows.
        wandb.run.log(payload, commit=False)
        reached.append("wandb")
    mlflow = sys.modules.get("mlflow")
    if "mlflow" in targets and mlflow is not None and mlflow.active_run() is not None:
        mlflow.log_metrics({k.replace("/", "."): v for k, v in metrics.items()}, step=step)
        for path in _files(files):
            mlflow.log_artifact(path, artifact_path="te_gemm")
        reached.append("mlflow")
    return reached
