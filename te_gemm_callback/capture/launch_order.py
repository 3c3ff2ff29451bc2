"""Owners of TE GEMMs by launch position, for instrumented steps without module hooks."""

from __future__ import annotations

from typing import Any


class LaunchOwners:
    """Owners of TE GEMMs by launch position, so that instrumented steps after the first need no module hooks (most
    of their host cost: docs/results/h200.md, launch order). A hooked step appends each call's (key, owner, (site,
    recompute) or None) to ``trace``, the next step's reference. In a step run ``by_order`` the n-th call takes the
    n-th reference entry if its key matches; a mismatch marks the step ``failed`` (its TE GEMMs dropped, the next
    steps hooked).

        >>> o = LaunchOwners(); o.trace.append((("TN", 1, 2), "fc1", None)); o.begin_step(by_order=True)
        >>> o.at(("TN", 1, 2)), o.failed, o.at(("NN", 1, 2)), o.failed
        ('fc1', False, None, True)
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every trace (a new capture), in place: the wrappers keep this object."""
        self.reference: list[tuple[tuple, str | None, Any]] = []
        self.trace: list[tuple[tuple, str | None, Any]] = []
        self.by_order = False
        self.begin_step(by_order=False)

    def begin_step(self, by_order: bool) -> None:
        """Open a step: hooked (``by_order`` False: record a trace) or by launch order."""
        if self.trace and not self.by_order:
            self.reference = self.trace  # the step that just closed was hooked: its trace
        self.trace = []
        self.by_order = by_order and bool(self.reference)
        self.failed = False
        self._pos = 0

    def next_entry(self, ckey: tuple) -> tuple | None:
        """The reference entry (key, owner, (site, recompute) or None) here, or None on a mismatch."""
        i = self._pos
        self._pos = i + 1
        ref = self.reference
        if i < len(ref) and ref[i][0] == ckey:
            return ref[i]
        self.failed = True
        return None

    def at(self, ckey: tuple) -> str | None:
        """The owner of the call at this launch position (None on a mismatch)."""
        entry = self.next_entry(ckey)
        return entry[1] if entry is not None else None

    def complete(self) -> bool:
        """Whether the step run by order matched the reference call for call, to its end."""
        return not self.failed and self._pos == len(self.reference)
