"""Owners of TE GEMMs by launch position: the reference a hooked step leaves for the
instrumented steps after it, which then run with no module hooks."""

from __future__ import annotations

from typing import Any


class LaunchOwners:
    """Owners of TE GEMMs by launch position, so that instrumented steps after the first need no
    module hooks (the largest part of an instrumented step's host cost: docs/results/h200.md, facts
    the code relies on: launch order).

    A hooked step appends each TE GEMM call's key (layout, operand shapes and types), its owner,
    and, where the plain wrapper resolved them, its (site, recompute) to ``trace``;
    :meth:`begin_step` makes the last complete trace the reference. In a step run ``by_order`` the
    n-th call takes the n-th reference entry when its key matches; any mismatch (another call
    order, other shapes) marks the step ``failed``: the profiler then drops that step's TE GEMMs
    and hooks the next instrumented steps again.

    Example:
        >>> o = LaunchOwners(); o.trace.append((("TN", 1, 2), "fc1", None)); o.begin_step(by_order=True)
        >>> o.at(("TN", 1, 2)), o.failed, o.at(("NN", 1, 2)), o.failed
        ('fc1', False, None, True)
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every trace (a new capture): the wrappers keep this object, so it is reset in place."""
        self.reference: list[tuple[tuple, str | None, Any]] = []
        self.trace: list[tuple[tuple, str | None, Any]] = []
        self.by_order = False
        self.failed = False
        self._pos = 0

    def begin_step(self, by_order: bool) -> None:
        """Open a step: hooked (``by_order`` False: record a trace) or by launch order."""
        if self.trace and not self.by_order:
            self.reference = self.trace  # the step that just closed was hooked: its trace
        self.trace = []
        self.by_order = by_order and bool(self.reference)
        self.failed = False
        self._pos = 0

    def next_entry(self, ckey: tuple) -> tuple | None:
        """The reference entry (key, owner, (site, recompute) or None) at this launch position, or
        None on a mismatch (the step failed)."""
        i = self._pos
        self._pos = i + 1
        ref = self.reference
        if i < len(ref) and ref[i][0] == ckey:
            return ref[i]
        self.failed = True
        return None

    def at(self, ckey: tuple) -> str | None:
        """The owner of the call at this launch position (None, and the step failed, on a mismatch)."""
        entry = self.next_entry(ckey)
        return entry[1] if entry is not None else None

    def complete(self) -> bool:
        """Whether the step run by order matched the reference call for call, to its end."""
        return not self.failed and self._pos == len(self.reference)
