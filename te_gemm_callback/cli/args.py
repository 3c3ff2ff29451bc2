"""Argument types and up-front checks shared by the commands: each refusal one line, before anything runs."""

from __future__ import annotations

import argparse
import dataclasses
import re
import textwrap
from functools import partial
from pathlib import Path

from te_gemm_callback.precisions import parse_recipes
from te_gemm_callback.printable import safe
from te_gemm_callback.shapes import ModelConfig


class UsageError(ValueError):
    """A command line that cannot work as given: exit 2, as argparse's own refusals (other errors: 1)."""


EXIT_CODES = """exit codes:
  0    done
  1    the run or its inputs failed: a bad run folder or input file, an output that would replace a file of \
another kind, every measurement failed
  2    a usage error: a bad flag, value or combination of flags (as argparse refuses them); nothing measured or \
written
  130  interrupted: Ctrl-C, or SIGTERM during a multi-GPU bench"""

# Where a run folder's captures lie: its own and its sweep's, or those of one run per recipe in its subfolders.
RUN_CAPTURES = ("gemm_capture.json", "sweep/*/gemm_capture.json", "*/gemm_capture.json",
                "*/sweep/*/gemm_capture.json")
MAX_RUN_STEPS = 100_000  # a demo run: more only trains longer (a huge count failed in Lightning)


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help says its default; descriptions and epilogs keep their lines, each wrapped."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or "(required" in text or action.default is argparse.SUPPRESS or \
                not action.option_strings:
            return text
        if action.required:
            return f"{text} (required)"
        if action.default is None:
            return f"{text} (default: none)"
        if isinstance(action.default, bool):  # store_true, --x/--no-x
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            item = re.match(r"\s+\S+\s+", line)  # an indented list item ("  1    what"): wrap under its text
            lead, hang = line[:len(line) - len(line.lstrip())], " " * item.end() if item else ""
            lines.append(textwrap.fill(line.strip(), width, initial_indent=indent + lead,  # paths stay whole
                                       subsequent_indent=indent + hang, break_on_hyphens=False)
                         if line.strip() else "")
        return "\n".join(lines)


def _int(text: str, least: int, what: str, most: int | None = None, unit: str = "") -> int:
    # ASCII digits only: int() takes other scripts' digits but not, say, superscripts ("²").
    t = text.strip()
    if not (t.lstrip("+-").isascii() and t.lstrip("+-").isdigit()) or len(t) > 30:  # int() refuses 4300+ digits
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    v = int(t)
    if v < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    if most is not None and v > most:
        raise argparse.ArgumentTypeError(f"expected at most {most} {unit}, got {v}")
    return v


def _limit(text: str) -> int | None:
    """Rows to print: a positive count, or 0 for every row (None)."""
    return _int(text, 0, "a row count (0: every row)") or None


def _path(text: str, what: str = "file") -> str:
    # An empty file path was taken as "no file" (nothing written, exit 0); an empty folder is ".".
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a {what} path, got an empty string")
    return text


def float_in(text: str, lo: float, hi: float, what: str = "a number") -> float:
    """``text`` as a number from ``lo`` to ``hi`` (NaN and infinities refused)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what} from {lo:g} to {hi:g}, got {text!r}") from None
    if not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"expected {what} from {lo:g} to {hi:g}, got {v:g}")
    return v


_positive = partial(_int, least=1, what="a positive integer")
_non_negative = partial(_int, least=0, what="a non-negative integer")
_run_steps = partial(_int, least=3, what="at least 3 steps (1 untouched, 1 warm-up, 1 captured)", most=MAX_RUN_STEPS,
                     unit="steps")
_file_path = _path
_dir_path = partial(_path, what="folder")


def check_run_dir(run_dir: str) -> None:
    """Refuse a folder none of whose :data:`RUN_CAPTURES` exist (`te-gemm report /` walked the whole filesystem)."""
    root = Path(run_dir)
    if root.is_dir() and not any(next(root.glob(p), None) for p in RUN_CAPTURES):  # not a folder: the report's line
        raise ValueError(f"{run_dir} holds no gemm_capture.json, nor do its subfolders or sweep/: point at the "
                         "callback's output folder")


def parse_precisions(text: str | None) -> list[str] | None:
    """``--precisions`` of bench and run (None: not given); a bad one is a usage error."""
    try:
        return None if text is None else parse_recipes(text)
    except ValueError as err:
        raise UsageError(f"--precisions: {err}") from None


def more_rows_hint(out, total: int, limit: int | None) -> None:
    """Under a table cut at ``limit`` rows: how many were left out and the flag that shows them."""
    if limit is not None and total > limit:
        out.print(f"[dim]{total - limit} more row(s) not shown: --limit 0 shows every row[/dim]")


def where(path: object) -> str:
    """An output path as the closing line names it."""
    return "standard output" if str(path) == "-" else safe(path)


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("model config" if required else
                             "model config (one source of shapes: these flags, or --shapes, or --capture)")
    # Without a config (bench from --shapes or --capture) these stay unset: "(default: none)".
    g.add_argument("--hidden-size", type=_positive, required=required, help="H, the model width")
    g.add_argument("--intermediate-size", type=_positive, required=required, help="I, the MLP width")
    g.add_argument("--num-attention-heads", type=_positive, required=required, help="attention heads")
    g.add_argument("--num-key-value-heads", type=_positive, help="GQA/MQA key/value heads (default: = heads)")
    g.add_argument("--head-dim", type=_positive, help="per-head width (default: hidden / heads)")
    g.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=False,
                   help="SwiGLU/GeGLU: gate and up projections")
    g.add_argument("--fused-gate-up", action=argparse.BooleanOptionalAction, default=True,
                   help="gate+up as one 2I GEMM (TE LayerNormMLP) or two I GEMMs")
    g.add_argument("--fused-qkv", action=argparse.BooleanOptionalAction, default=True,
                   help="q, k and v as one GEMM or three")
    g.add_argument("--num-experts", type=_non_negative, default=0, help="MoE experts per layer (0: a dense MLP)")
    g.add_argument("--top-k", type=_positive, default=1, help="experts each token is routed to")
    g.add_argument("--tensor-parallel", type=_positive, default=1, help="tensor-parallel ranks the GEMMs split over")
    g.add_argument("--vocab-size", type=_positive, help="adds the lm_head GEMM (default: none, no lm_head)")
    g.add_argument("--num-hidden-layers", type=_positive, required=required, help="transformer layers")
    g.add_argument("--micro-batch-size", type=_positive, required=required, help="sequences per micro-batch")
    g.add_argument("--sequence-length", type=_positive, required=required, help="tokens per sequence")


def config_from_args(a: argparse.Namespace) -> ModelConfig:
    """The model config the flags give; flags that contradict each other are a usage error."""
    try:
        return ModelConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ModelConfig)})
    except ValueError as err:
        raise UsageError(str(err)) from None
