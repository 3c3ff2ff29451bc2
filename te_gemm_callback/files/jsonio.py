"""The one place files are read and written: bounded reads checked against :data:`SPECS`; atomic
writes, never through a link, over an existing file only of the kind being written. Every refusal is
a one-line ValueError or OSError that names the file."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

# Imported from here by other modules.
from te_gemm_callback.files.specs import BENCH_RESULT, CACHE_FILE, CAPTURE_FILE, MAX_DIM, MAX_INT, SPECS, S  # noqa: F401
from te_gemm_callback.printable import plain

T = TypeVar("T")

# Far above any file we write, low enough that `te-gemm show /dev/zero` stops at once.
MAX_READ_BYTES = 256 * 1024 * 1024
# Our files nest 4-6 levels; deeper is hand-made and would hit recursion limits further on.
MAX_DEPTH = 64
# A "\udc80" escape decodes to a lone surrogate: text no file or terminal can take.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
STDOUT = "-"  # an output path that means standard output


def read_bytes_bounded(path: Path, limit: int | None = None) -> bytes:
    """At most ``limit`` bytes (default :data:`MAX_READ_BYTES`) of a file or pipe, else ValueError."""
    limit = limit or MAX_READ_BYTES
    st = os.stat(path)
    # Before open: a named FIFO with no writer blocks forever; `<(...)`'s /dev/fd/N has its writer.
    if stat.S_ISSOCK(st.st_mode) or (stat.S_ISFIFO(st.st_mode)
                                     and not str(path).startswith(("/dev/fd/", "/proc/self/fd/"))):
        raise ValueError(f"{plain(path)} is a FIFO or socket, not a file: give the path of a JSON file")
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):  # /dev/zero, /dev/urandom: endless
            raise ValueError(f"{path} is a device, not a file: give the path of a JSON file")
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise ValueError(f"{path} is {st.st_size / 2**20:.0f} MiB, over the {limit >> 20} MiB limit "
                             "for files this tool reads: is it the right file?")
        data = f.read(limit + 1)  # a pipe has no size: read one byte past the limit to know
    if len(data) > limit:
        raise ValueError(f"{path} is over the {limit >> 20} MiB limit for files this tool reads: is it the right file?")
    return data


def _depth_ok(data: Any) -> bool:
    stack = [(data, 1)]  # iterative: a recursive walk would itself hit the limit it checks
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > MAX_DEPTH:
                return False
            stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return True


def parse_json(raw: bytes) -> Any:
    """Parse bytes as JSON; ValueError with the reason in a few words (never RecursionError)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text, so not JSON") from None
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as err:  # JSONDecodeError, or an integer of more than 4300 digits
        raise ValueError(f"not valid JSON ({str(err).splitlines()[0][:120]})") from None
    if not _depth_ok(data):
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    # Lone surrogates read as U+FFFD, so a name never fails a report half-written.
    return whole_text(data) if _SURROGATE_ESCAPE.search(raw) else data


def whole_text(data: Any) -> Any:
    """``data`` with every lone surrogate in its strings (keys included) replaced by U+FFFD."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return data
        except UnicodeEncodeError:
            return data.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(data, list):
        return [whole_text(v) for v in data]
    if isinstance(data, dict):
        return {whole_text(k): whole_text(v) for k, v in data.items()}
    return data


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """A JSON file's content (bounded, depth-checked); ValueError naming the file otherwise."""
    try:
        return parse_json(read_bytes_bounded(Path(path)))
    except OSError as err:
        raise ValueError(f"cannot read {what} {path}: {err.strerror or err}") from None
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if msg.startswith(str(path)) else f"cannot read {what} {path}: {msg}") from None


def schema_of(data: Any) -> str | None:
    s = data.get("schema") if isinstance(data, dict) else None
    return s if isinstance(s, str) else None


def read_schema(path: str | Path, schema: str, what: str, accept: Callable[[Any], bool] | None = None) -> Any:
    """A JSON file of ``schema`` checked against :data:`SPECS` (or whose content ``accept`` takes)."""
    data = read_json(path, what)
    if schema_of(data) != schema and not (accept and accept(data)):
        raise ValueError(f"{path} is not a {what} (schema {schema_of(data)!r}, want {schema!r})")
    if schema in SPECS:
        try:
            check(data, SPECS[schema])
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    return data


def from_fields(cls: type[T], d: dict[str, Any]) -> T:
    """Dataclass ``cls`` from ``d``, ignoring fields it does not know (newer files still load)."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in d.items() if k in known})


def _describe(s: S) -> str:
    base = {"int": "an integer", "num": "a number", "str": "a string", "bool": "true or false",
            "list": "a list", "dict": "an object", "any": "anything"}[s.kind]
    if s.choices:
        base = "one of " + ", ".join(map(str, s.choices))
    n = lambda x: str(int(x)) if float(x).is_integer() else f"{x:g}"  # noqa: E731
    most = s.most if s.most is not None and s.most != MAX_INT else None
    if s.least is not None and most is not None:
        base += f" from {n(s.least)} to {n(most)}"
    else:
        bounds = [f"{op} {n(x)}" for op, x in ((">=", s.least), (">", s.above), ("<=", most)) if x is not None]
        base += " " + " and ".join(bounds) if bounds else ""
    return base + (" or null" if s.null else "")


def _short(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check(value: Any, spec: S, where: str = "") -> None:
    """Raise ValueError ``"<where>: expected ..., got ..."`` where ``value`` departs from ``spec``."""
    def bad(why: str = "") -> ValueError:
        return ValueError(f"{where or 'the file'}: expected {_describe(spec)}, got {why or _short(value)}")

    if value is None:
        if spec.null or spec.kind == "any":
            return
        raise bad("null")
    k = spec.kind
    if k == "bool" and not isinstance(value, bool):
        raise bad()
    if k in ("int", "num"):
        _check_number(value, spec, bad)
    elif k == "str":
        if not isinstance(value, str) or (spec.choices and value not in spec.choices):
            raise bad()
    elif k == "list":
        if not isinstance(value, (list, tuple)):  # tuples: in-memory objects (GemmCapture.validate)
            raise bad()
        if spec.item is not None and spec.item.kind != "any":
            for i, v in enumerate(value):
                check(v, spec.item, f"{where}[{i}]")
    elif k == "dict":
        if not isinstance(value, dict):
            raise bad()
        _check_fields(value, spec, where)


def _check_number(value: Any, spec: S, bad: Callable[..., ValueError]) -> None:
    if isinstance(value, bool) or not isinstance(value, int if spec.kind == "int" else (int, float)):
        raise bad()
    if isinstance(value, int) and abs(value) > MAX_INT:  # also keeps float(value) from overflowing
        raise bad("a number too large")
    if isinstance(value, float) and not math.isfinite(value):
        if spec.finite:
            raise bad()
        return  # left to the later check, which says what a non-finite value means there
    if (spec.least is not None and value < spec.least) or (spec.above is not None and value <= spec.above) or \
            (spec.most is not None and value > spec.most):
        raise bad()


def _check_fields(value: dict, spec: S, where: str) -> None:
    prefix = where + "." if where else ""
    for name in spec.required:
        if name not in value:
            raise ValueError(f"{prefix}{name}: missing")
    for name, sub in spec.fields:
        if name in value:
            check(value[name], sub, f"{prefix}{name}")
    if spec.item is not None:
        for name, v in value.items():
            check(v, spec.item, f"{prefix}{name}")


KindCheck = Callable[[Path], None]  # raises ValueError unless the existing file at the path is ours to replace


def json_kind(schema: str | None, accept: Callable[[Any], bool] | None = None) -> KindCheck:
    """Replace only a JSON file of ``schema`` (or whose content ``accept`` takes); None: replace nothing."""
    def kind(path: Path) -> None:
        try:
            old = parse_json(read_bytes_bounded(path))
            ours = schema is not None and (schema_of(old) == schema or bool(accept and accept(old)))
            held = schema_of(old) or "another kind of JSON"
        except (OSError, ValueError):  # unreadable, too large, not UTF-8, not JSON: not ours
            ours, held = False, "something that is not JSON"
        if not ours:
            raise ValueError(f"refusing to overwrite {path}: it holds {held}, not a {schema or 'file this tool'} "
                             "file; move it or pick another path")
    return kind


def text_kind(what: str, *prefixes: bytes) -> KindCheck:
    """Replace only a file that starts with one of ``prefixes`` (the marker we write first)."""
    def kind(path: Path) -> None:
        try:
            with open(path, "rb") as f:
                head = f.read(4096)
        except OSError:
            head = b""
        if not head.startswith(prefixes):
            raise ValueError(f"refusing to overwrite {path}: it is not a {what} this tool wrote; "
                             "move it or pick another path")
    return kind


def _no_linked_parents(p: Path, root: str | Path) -> None:
    """Refuse a linked folder between ``root`` and ``p``: it would carry a write outside the folder named."""
    root = Path(root)
    try:
        rel = p.parent.relative_to(root)
    except ValueError:
        raise ValueError(f"refusing to write {p}: it is not inside {root}") from None
    d = root
    for part in rel.parts:
        d = d / part
        if part == ".." or d.is_symlink():
            raise ValueError(f"refusing to write {p}: {d} is a symbolic link or leaves {root}; "
                             "give real folders") from None


def check_target(path: str | Path, kind: KindCheck | None, root: str | Path | None = None) -> Path:
    """Everything :func:`write_bytes_atomic` refuses, checked without writing (before minutes of measuring).
    ``kind`` None: never replace a file; ``root``: no folder between it and the file may be a link."""
    if isinstance(path, str) and not path.strip():
        raise ValueError("empty output path: give a file name")
    if str(path) == STDOUT:
        return Path(STDOUT)
    p = Path(path)
    if root is not None:
        _no_linked_parents(p, root)
    if p.is_symlink():
        raise ValueError(f"refusing to write {p}: it is a symbolic link (to {os.readlink(p)}); give the real path")
    try:
        st = p.stat()
    except FileNotFoundError:
        return p
    except OSError as err:
        raise ValueError(f"cannot write {p}: {err.strerror or err}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{p} is a folder: give a file path")
    if not stat.S_ISREG(st.st_mode):  # /dev/null, a FIFO: replacing it would break the system's file
        raise ValueError(f"refusing to overwrite {p}: it is not a regular file; pick another path")
    if kind is None:
        raise ValueError(f"refusing to overwrite {p}: it exists; move it or pick another path")
    kind(p)
    return p


def write_bytes_atomic(path: str | Path, data: bytes, kind_check: KindCheck | None,
                       root: str | Path | None = None) -> Path:
    """Write ``data`` to ``path`` atomically after :func:`check_target`'s refusals, keeping a replaced file's mode."""
    path = check_target(path, kind_check, root)
    try:  # a 0600 report.json the user locked down stays 0600 when rewritten
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # 0o666 through the umask, as the user's other files get: mkstemp's 0600 hid runs from teammates.
    # O_EXCL | O_NOFOLLOW: never write through a link someone planted under the temporary name.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as err:  # named after the target: the temporary name means nothing to the user
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the rename must not publish a file whose bytes are not on disk
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):  # a full disk, `ulimit -f`: one line that names the file, old file kept
            raise OSError(err.errno, err.strerror or str(err), str(path)) from None
        raise
    return path


def _print(text: str) -> Path:
    sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
    sys.stdout.flush()
    return Path(STDOUT)


def write_json(path: str | Path, data: Any, indent: int | None = 1, schema: str | None = None,
               accept: Callable[[Any], bool] | None = None, root: str | Path | None = None) -> Path:
    """Write ``data`` as JSON atomically (``-``: standard output), over a file of ``schema`` (default: ``data``'s)."""
    kind = json_kind(schema or schema_of(data), accept)
    text = json.dumps(data, indent=indent)
    if _SURROGATE_ESCAPE.search(text.encode()):  # a lone surrogate from a live name: valid UTF-16 only
        text = json.dumps(whole_text(data), indent=indent)
    if str(path) == STDOUT:
        return _print(text)
    return write_bytes_atomic(path, text.encode(), kind, root)


def write_text(path: str | Path, text: str, kind_check: KindCheck | None = None) -> Path:
    """Write a text file atomically (``-``: standard output), over a file ``kind_check`` accepts."""
    if str(path) == STDOUT:
        return _print(whole_text(text))
    return write_bytes_atomic(path, whole_text(text).encode(), kind_check)
