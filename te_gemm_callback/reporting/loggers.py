"""The report where users already look: their training job's own logger.

Metrics (the capture's summary, the sweep's observed speedups, the report's predictions) go to
every logger as scalars; the figures and the verdict table go where a logger takes them:
TensorBoard images and text, W&B images and a text panel, MLflow artifacts. Nothing here imports
a logger library the job did not load already: a Lightning logger is reached through its own
object, a Hugging Face ``report_to`` integration through the module the Trainer imported
(``sys.modules``), TensorBoard through ``torch.utils.tensorboard`` only when the job asked for it.
"""

from __future__ import annotations

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
    """Scalars from the report: per recipe the microbenchmarked GEMM speedup and the predicted step
    speedup (the observed ones come from the sweep's own metrics, the GEMM share from the capture's)."""
    rep = read_json(files["report"])
    out: dict[str, float] = {}
    # No GEMM share here: te_gemm/gemm_share (summary_metrics, the capture's) is the one share a
    # dashboard shows; report.json keeps the report's own (of its baseline run's step).
    for recipe, v in ((rep.get("meta") or {}).get("mfu") or {}).items():  # precision-aware (projection/mfu.py)
        if isinstance(v, (int, float)):
            out[f"te_gemm/report/mfu/{recipe}"] = float(v)
    for r in rep.get("recipes", []):
        for key in ("gemm_speedup", "predicted_step_speedup"):
            if isinstance(r.get(key), (int, float)):
                out[f"te_gemm/report/{key}/{r['recipe']}"] = float(r[key])
    return out


def verdict_markdown(files: dict[str, Path]) -> str:
    """The verdicts and tables as Markdown: the report.md the report wrote (its writer renders the
    tables; nothing here renders them again)."""
    md = files.get("report_md")
    return Path(md).read_text() if md is not None and Path(md).is_file() else ""


def _figures(files: dict[str, Path]) -> list[tuple[str, Path]]:
    return [(f"te_gemm/{k}", Path(files[k])) for k in FIGURES if k in files and Path(files[k]).is_file()]


def _image(path: Path) -> Any:
    """A PNG as an HxWxC uint8 array (TensorBoard's add_image), read with matplotlib, a dependency already."""
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    return (img[..., :3] * 255).astype("uint8") if img.dtype != "uint8" else img[..., :3]


def to_tensorboard(writer: Any, files: dict[str, Path], step: int) -> None:
    for tag, path in _figures(files):
        writer.add_image(tag, _image(path), step, dataformats="HWC")
    writer.add_text("te_gemm/report", verdict_markdown(files), step)
    writer.flush()


def to_lightning_logger(logger: Any, files: dict[str, Path], step: int) -> None:
    """Figures and the verdict table to one Lightning logger, by what it is (metrics went through
    ``log_metrics`` already). A CSV logger takes no artifacts: the files are in the run folder."""
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
        for path in files.values():
            if Path(path).is_file():
                logger.experiment.log_artifact(logger.run_id, str(path), artifact_path="te_gemm")


def hf_logging_dir(args: Any, since: float | None = None) -> str:
    """Where the Trainer's TensorBoard integration writes: ``TENSORBOARD_LOGGING_DIR``, else
    ``args.logging_dir`` (transformers before 5), else the Trainer's own run folder: the newest
    ``output_dir/runs/<time>_<host>`` with an event file made since ``since`` (its TensorBoard
    callback made it when training began, before ours ran). Failing all, a run of ours named the
    same way (``runs/<time>_<host>_te_gemm``): never a folder two jobs would share."""
    env = os.getenv("TENSORBOARD_LOGGING_DIR") or getattr(args, "logging_dir", None)
    if env:
        return env
    runs = Path(args.output_dir) / "runs"
    if since is not None and runs.is_dir():
        made = [(f.stat().st_mtime, f.parent) for d in runs.iterdir() if d.is_dir()
                for f in d.glob("events.out.tfevents.*") if f.stat().st_mtime >= since]
        if made:
            return str(max(made)[1])
    import socket
    from datetime import datetime

    return str(runs / f"{datetime.now().strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}_te_gemm")


def to_report_to(report_to: Any, logging_dir: str | None, metrics: dict[str, float], files: dict[str, Path],
                 step: int) -> list[str]:
    """Hugging Face ``TrainingArguments.report_to``: metrics, figures and the verdict table to each
    integration the job reports to; returns the integrations reached."""
    targets = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in targets:
        targets = ["tensorboard", "wandb", "mlflow"]
    reached = []
    if "tensorboard" in targets and logging_dir:
        try:
            from torch.utils.tensorboard import SummaryWriter  # the Trainer's own TensorBoard integration uses it
        except ImportError:
            pass
        else:
            # A writer of our own in the Trainer's logging_dir: TensorBoard reads every event file there.
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
        payload: dict[str, Any] = dict(metrics)
        payload.update({tag: wandb.Image(str(p)) for tag, p in _figures(files)})
        if files:
            # HTML-escaped: module and recipe names come from the job's files ("<top>", a
            # "<script>" in a name must reach the panel as text).
            payload["te_gemm/report"] = wandb.Html(f"<pre>{html.escape(verdict_markdown(files))}</pre>")
        wandb.run.log(payload, step=step)
        reached.append("wandb")
    mlflow = sys.modules.get("mlflow")
    if "mlflow" in targets and mlflow is not None and mlflow.active_run() is not None:
        mlflow.log_metrics({k.replace("/", ".") : v for k, v in metrics.items()}, step=step)
        for path in files.values():
            if Path(path).is_file():
                mlflow.log_artifact(str(path), artifact_path="te_gemm")
        reached.append("mlflow")
    return reached
