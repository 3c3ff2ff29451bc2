"""Options defined once: each is one field of a stage's dataclass, with its default, its line of
documentation and its check (:func:`option`). The stages' configs are
:class:`~te_gemm_callback.capture.config.CaptureConfig`,
:class:`~te_gemm_callback.sweep.config.SweepConfig` and
:class:`~te_gemm_callback.reporting.config.ReportConfig`; :class:`~te_gemm_callback.schedule.GemmSchedule`
and the callbacks take the fields of all three as keyword arguments (by each field's keyword),
``help()`` lists them from the fields, and a bad value fails at construction with one line that
names the keyword the user wrote and what to give instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

Check = Callable[[Any, str], Any]  # (value, the keyword the user wrote) -> the value to keep
T = TypeVar("T", bound="Options")


def option(default: Any, doc: str, check: Check | None = None, *, kw: str | None = None,
           to: str | None = None) -> Any:
    """A config field: ``doc`` is its line in ``help()``, ``check`` refuses a bad value (ValueError)
    or returns the value to keep (a recipe's TE name, a tuple for a list); ``kw`` the keyword the
    schedule and the callbacks take it by (default: the field's name; "" for none); ``to`` the
    object the schedule hands it to by name ("profiler": :class:`~te_gemm_callback.GemmProfiler`)."""
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check, "kw": kw, "to": to})


def refuse_unknown(owner: str, given: Iterable[str], known: Sequence[str]) -> None:
    """A keyword that none of ``known`` is, refused in one line with the nearest one the user may
    have meant (else the ones ``owner`` takes)."""
    bad = sorted(set(given) - set(known))
    if bad:
        near = difflib.get_close_matches(bad[0], known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else f"; it takes {', '.join(known)}"
        raise TypeError(f"{owner} got an unexpected keyword argument {bad[0]!r}{hint}")


def same_as(config: type, name: str, **overrides: Any) -> Any:
    """Another config's field ``name`` as a field of this one (its default, doc and check), with
    ``overrides`` of :func:`option`'s keywords (``to``, ``kw``): one definition for an option two
    configs take."""
    f = {f.name: f for f in dataclasses.fields(config)}[name]
    return dataclasses.field(default=f.default, metadata={**f.metadata, **overrides})


@dataclasses.dataclass(frozen=True)
class Options:
    """A stage's options as a frozen dataclass of :func:`option` fields, each checked when it is
    built. ``labels`` (field -> the keyword the user wrote) only names them in the messages."""

    labels: dataclasses.InitVar[dict[str, str] | None] = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self, labels: dict[str, str] | None = None) -> None:
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None:
                name = (labels or {}).get(f.name, f.name)
                object.__setattr__(self, f.name, check(getattr(self, f.name), name))
        self.check_together(labels or {})

    def check_together(self, labels: dict[str, str]) -> None:
        """Checks across fields (``labels``: field -> the keyword the user wrote)."""

    @classmethod
    def given(cls: type[T], owner: str, config: T | None, options: dict[str, Any]) -> T:
        """``config``, or the config of the keyword arguments ``options`` by field name (never both):
        what a function that takes either (``GemmProfiler``, ``run_sweep``) was given."""
        if config is not None:
            if options:
                raise TypeError(f"{owner} takes its options either as config or as keywords, not both")
            return config
        refuse_unknown(owner, options, [f.name for f in dataclasses.fields(cls)])
        return cls(**options)

    @classmethod
    def keywords(cls) -> dict[str, str]:
        """{the keyword the schedule takes: field name} for the fields it takes."""
        out = {}
        for f in dataclasses.fields(cls):
            kw = f.metadata.get("kw")
            if kw != "":
                out[kw or f.name] = f.name
        return out

    @classmethod
    def take(cls: type[T], given: dict[str, Any]) -> T:
        """The config from the schedule's keyword arguments in ``given`` (taken out of it)."""
        kws = cls.keywords()
        values = {field: given.pop(kw) for kw, field in kws.items() if kw in given}
        return cls(**values, labels={field: kw for kw, field in kws.items()})

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """{keyword: default} of the fields the schedule takes."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return {kw: fields[name].default for kw, name in cls.keywords().items()}

    @classmethod
    def doc(cls, indent: str = "        ") -> str:
        """The fields the schedule takes, one documented argument each (Google style)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return "\n".join(textwrap.fill(f"{kw}: {fields[name].metadata['doc']}", 100, initial_indent=indent,
                                        subsequent_indent=indent + "    ", break_on_hyphens=False)
                         for kw, name in cls.keywords().items())

    def handed_to(self, target: str) -> dict[str, Any]:
        """{field: value} of the fields handed to ``target`` by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata.get("to") == target}


# --- checks: each refuses with the keyword's name and returns the value kept ---------------------

def integer(least: int, why: str = "") -> Check:
    """An integer >= ``least`` (not a bool); ``why`` ends the message."""
    def check(v: Any, name: str) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{name} must be an integer >= {least}{why}, got {v!r}")
        return v
    return check


def seconds(v: Any, name: str) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {v!r}")
    return v


def switch(v: Any, name: str) -> Any:
    """True or False: a truth test took "no" for True and None for False."""
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be True or False, got {v!r}")
    return v


def one_of(*allowed: Any) -> Check:
    """One of ``allowed`` (compared by value, so True is not 1 here)."""
    def check(v: Any, name: str) -> Any:
        if not any(v is a or (type(v) is type(a) and v == a) for a in allowed):
            said = ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"
            raise ValueError(f"{name} must be {said}, got {v!r}")
        return v
    return check


def function_or_none(what: str) -> Check:
    def check(v: Any, name: str) -> Any:
        if v is not None and not callable(v):
            raise ValueError(f"{name} must be {what} or None, got {v!r}")
        return v
    return check
