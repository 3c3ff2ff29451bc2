"""Figures as PNG files marked as ours (:data:`FIGURE_MARKER`), written atomically over nothing but our own."""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path
from typing import Any

from te_gemm_callback.files.jsonio import check_target, write_bytes_atomic

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURE_MARKER = "te-gemm-callback"  # the "Software" text chunk of every PNG we write
# Text chunks sit in the first few KB of our figures; a user's huge PNG is not read past this.
_MAX_CHUNKS = 4096


def png_software(path: Path) -> str | None:
    """The "Software" text chunk of a PNG ("" without one, None for no readable PNG), seeking past other chunks."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != PNG_SIGNATURE:
                return None
            for _ in range(_MAX_CHUNKS):
                head = f.read(8)
                if len(head) < 8:
                    return ""
                size, kind = struct.unpack(">I4s", head)
                if kind == b"IEND":
                    return ""
                if kind in (b"tEXt", b"iTXt") and size <= 4096:
                    key, _, rest = f.read(size).partition(b"\0")
                    f.seek(4, io.SEEK_CUR)  # CRC
                    if key != b"Software":
                        continue
                    if kind == b"iTXt":  # compression flag, method, language\0, translated keyword\0
                        if rest[:1] != b"\0":
                            return ""
                        rest = rest[2:].split(b"\0", 2)[-1]
                    return rest.decode("latin-1" if kind == b"tEXt" else "utf-8", "replace")
                f.seek(size + 4, io.SEEK_CUR)
    except OSError:
        return None
    return ""


def PNG_KIND(path: Path) -> None:
    """The kind check for figures: replace only a PNG that carries our marker."""
    software = png_software(path)
    if software != FIGURE_MARKER:
        what = ("not a PNG figure this tool wrote" if software is None else
                f"a PNG this tool did not write (no 'Software: {FIGURE_MARKER}' in its metadata)")
        raise ValueError(f"refusing to overwrite {path}: it is {what}; move it or pick another path")


# A plain file name: no folder part, no "." / "..", no control characters (names reach terminals).
_PLAIN = re.compile(r"[^/\\\x00-\x1f\x7f]+")


def plain_name(name: Any, what: str = "figure") -> str:
    """``name`` if it is a plain file name (it stays in the folder it is joined to); else ValueError."""
    if not isinstance(name, str) or not _PLAIN.fullmatch(name) or name in (".", "..") or len(name) > 255:
        raise ValueError(f"refusing to write {what} {name!r}: not a plain file name (a name inside the run folder, "
                         "no '/' or '..'); fix the file it came from")
    return name


def write_figure_atomic(fig: Any, path: str | Path, **savefig_kw: Any) -> Path:
    """Save a matplotlib figure (left open) as a PNG marked as ours, atomically, over a figure we wrote only."""
    check_target(path, PNG_KIND)  # before drawing: a refusal costs nothing
    buf = io.BytesIO()
    meta = {**(savefig_kw.pop("metadata", None) or {}), "Software": FIGURE_MARKER}
    fig.savefig(buf, **{"format": "png", **savefig_kw, "metadata": meta})
    return write_bytes_atomic(path, buf.getvalue(), PNG_KIND)
