"""The one place files are written as JSON (captures, bench results, reports, summaries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, data: Any, indent: int | None = 1) -> Path:
    """Write ``data`` to ``path``, creating parent folders; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent))
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
