"""Where the tables go: the rich console (stdout, or stderr while a command writes JSON to
stdout), and printing a table to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    pass



_STDERR = False  # a command prints JSON on standard output (`--json -`): its tables go to stderr

def tables_to_stderr(on: bool = True) -> None:
    global _STDERR
    _STDERR = on

class _FileConsole(Console):
    """A console for a file or a pipe (a job's log): a table takes the width it needs, so that no
    cell is cut to fit a terminal that is not there; text wraps at the console's width."""

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
    """A console for the terminal, or for a file or a pipe one whose tables take the width they need
    (rich cuts them to 80 columns there); on standard error where standard output carries a
    command's JSON."""
    c = Console(stderr=_STDERR)
    return c if c.is_terminal else _FileConsole(width=120, stderr=_STDERR)

def print_table(table: Table, out: Console | None = None) -> None:
    (out or console()).print(table)
