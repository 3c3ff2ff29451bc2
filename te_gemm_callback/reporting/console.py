"""Where the tables go (stdout, or stderr while a command writes JSON to stdout), and how one is built."""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

_STDERR = False  # a command prints JSON on standard output (`--json -`): its tables go to stderr


def tables_to_stderr(on: bool = True) -> None:
    global _STDERR
    _STDERR = on


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits with 1 here; the CLI ends a closed pipe quietly with 141, tables and JSON alike.
        self.quiet = True
        raise BrokenPipeError


class _FileConsole(_Console):
    """A console for a file or pipe: a table takes the width it needs (no terminal to fit), text wraps."""

    def print(self, *objects: Any, **kw: Any) -> None:
        tables = [o for o in objects if isinstance(o, Table)]
        if not tables:
            super().print(*objects, **kw)
            return
        from rich.measure import Measurement
        need = max(Measurement.get(self, self.options.update(width=100_000), t).maximum for t in tables)
        # print(width=) cannot go past the console's own width: widen the console for this print.
        width = self.width
        self.width = max(width, need)
        try:
            super().print(*objects, **kw)
        finally:
            self.width = width


def console() -> Console:
    """The terminal's console, else one for a file or pipe whose tables are not cut to 80 columns."""
    c = _Console(stderr=_STDERR)
    return c if c.is_terminal else _FileConsole(width=120, stderr=_STDERR)


def print_table(table: Table, out: Console | None = None) -> None:
    (out or console()).print(table)


def make_table(title: str, columns: Iterable[str], left: Container[str] = (), wrap: Container[str] = (),
               rows: Iterable[Sequence[str]] = (), caption: str | None = None) -> Table:
    """A table whose ``left`` columns are left-aligned (the rest right) and only ``wrap`` columns wrap."""
    t = Table(title=title, caption=caption)
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right", no_wrap=c not in wrap)
    for row in rows:
        t.add_row(*row)
    return t
