"""The one place files are written as JSON (captures, bench results, reports, summaries, the cache).

Every write is atomic (a temporary file in the same folder, then a rename), so a reader never sees
half a file and a crash never leaves one. A file is only replaced by one of its own kind: each
writer names its schema, and an existing file of another kind (or not ours at all) is refused with
a one-line error instead of being overwritten.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def schema_of(data: Any) -> str | None:
    return data.get("schema") if isinstance(data, dict) else None


def check_replaceable(path: Path, schema: str) -> None:
    """Raise ValueError unless ``path`` is absent or already holds a file of ``schema``."""
    if not path.exists():
        return
    if path.is_dir():
        raise ValueError(f"{path} is a folder: give a file path")
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise ValueError(f"refusing to overwrite {path}: it is not a {schema} file (not JSON); "
                         "move it or pick another path") from None
    if schema_of(old) != schema:
        raise ValueError(f"refusing to overwrite {path}: it holds {schema_of(old) or 'another kind of JSON'}, "
                         f"not {schema}; move it or pick another path")


def write_json(path: str | Path, data: Any, indent: int | None = 1, schema: str | None = None) -> Path:
    """Write ``data`` to ``path`` atomically, creating parent folders; returns the path.

    ``schema``: the kind being written; an existing file of another kind is never replaced.
    """
    path = Path(path)
    if schema is not None:
        check_replaceable(path, schema)
    return write_text(path, json.dumps(data, indent=indent))


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file atomically (a temporary file in the same folder, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename must not publish a file whose bytes are not on disk
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def read_schema(path: str | Path, schema: str, what: str) -> dict[str, Any]:
    """A JSON file of ``schema``, or ValueError naming the file and what it is instead."""
    try:
        data = read_json(path)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {what} {path}: {err}") from None
    if schema_of(data) != schema:
        raise ValueError(f"{path} is not a {what} (schema {schema_of(data)!r}, want {schema!r})")
    return data


def from_fields(cls: type[T], d: dict[str, Any]) -> T:
    """Build dataclass ``cls`` from ``d``, ignoring fields it does not know (files written by a
    newer version still load)."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in d.items() if k in known})
