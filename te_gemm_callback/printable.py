"""Strings from users and files, made safe to print through rich."""

from __future__ import annotations

import logging
import random
import re
from typing import Any

# rich.style draws once from Python's global random stream when first imported: a job that seeded
# before importing us would draw differently after, so the stream is put back.
_stream = random.getstate()
from rich.markup import escape  # noqa: E402 (between the stream's save and its put-back)

random.setstate(_stream)

# C0 and C1 control characters (ESC opens ANSI and OSC sequences, CR and BS overwrite what was
# printed) and the bidirectional overrides (they reorder what a reader sees).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: Any) -> str:
    """``text`` with its control characters shown as "?" (for plain print and log lines)."""
    return _CONTROL.sub("?", str(text))


def safe(text: Any) -> str:
    """``text`` (any string a user or a file supplied) as rich prints it literally: control characters
    as "?", markup escaped (a module named ``[/b]`` is text, never a tag)."""
    return escape(plain(text))


def error_text(err: BaseException) -> str:
    """``"Type: message"`` of an exception, even one whose ``str()`` raises (it must never reach the job)."""
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:
        return f"{type(err).__name__}: (its message could not be read)"


_OURS = "_te_gemm_stderr"  # marks our own handler


def stderr_until_configured() -> None:
    """At import: our own stderr handler at INFO where the application has configured no logging (a job
    often imports us first and configures logging after: :func:`follow_job_logging` then steps aside)."""
    log = logging.getLogger("te_gemm_callback")
    if not logging.getLogger().hasHandlers() and not log.handlers:
        handler = logging.StreamHandler()
        setattr(handler, _OURS, True)
        log.setLevel(logging.INFO)
        log.addHandler(handler)
        log.propagate = False


def follow_job_logging() -> None:
    """Once the application has configured logging, our lines go to it at its level, not to our stderr handler."""
    log = logging.getLogger("te_gemm_callback")
    ours = [h for h in log.handlers if getattr(h, _OURS, False)]
    if ours and logging.getLogger().handlers:
        for h in ours:
            log.removeHandler(h)
        log.setLevel(logging.NOTSET)
        log.propagate = True
