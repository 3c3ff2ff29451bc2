"""Options defined once, as fields of a stage's config dataclass with their default, ``help()`` line
and check: a bad value fails at construction in one line naming the keyword the user wrote."""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

Check = Callable[[Any, str], Any]  # (value, the keyword the user wrote) -> the value to keep
T = TypeVar("T", bound="Options")


def option(default: Any, doc: str, check: Check | None = None, *, kw: str | None = None, to: str | None = None) -> Any:
    """A config field: ``doc`` its ``help()`` line; ``check`` returns the value to keep or raises
    ValueError; ``kw`` the schedule's keyword for it ("" for none); ``to`` the object it is handed to."""
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check, "kw": kw, "to": to})


def refuse_unknown(owner: str, given: Iterable[str], known: Sequence[str]) -> None:
    """Refuse a keyword not in ``known``, naming the nearest one the user may have meant."""
    bad = sorted(set(given) - set(known))
    if bad:
        near = difflib.get_close_matches(bad[0], known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else f"; it takes {', '.join(known)}"
        raise TypeError(f"{owner} got an unexpected keyword argument {bad[0]!r}{hint}")


def same_as(config: type, name: str, **overrides: Any) -> Any:
    """Another config's field ``name`` as a field of this one, with :func:`option`'s ``overrides``."""
    f = {f.name: f for f in dataclasses.fields(config)}[name]
    return dataclasses.field(default=f.default, metadata={**f.metadata, **overrides})


@dataclasses.dataclass(frozen=True)
class Options:
    """A stage's options, each checked when built; ``labels`` (field -> the keyword the user wrote) names them."""

    labels: dataclasses.InitVar[dict[str, str] | None] = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self, labels: dict[str, str] | None = None) -> None:
        labels = labels or {}
        for f in dataclasses.fields(self):
            if f.metadata.get("check") is not None:
                value = f.metadata["check"](getattr(self, f.name), labels.get(f.name, f.name))
                object.__setattr__(self, f.name, value)
        self.check_together(labels)

    def check_together(self, labels: dict[str, str]) -> None:
        """Checks across fields."""

    @classmethod
    def given(cls: type[T], owner: str, config: T | None, options: dict[str, Any]) -> T:
        """``config``, or the config of the keywords ``options`` (never both)."""
        if config is not None:
            if not isinstance(config, cls):
                raise TypeError(f"{owner}'s config must be a {cls.__name__}, got {type(config).__name__}")
            if options:
                raise TypeError(f"{owner} takes its options either as config or as keywords, not both")
            return config
        refuse_unknown(owner, options, [f.name for f in dataclasses.fields(cls)])
        return cls(**options)

    @classmethod
    def keywords(cls) -> dict[str, str]:
        """{the keyword the schedule takes: field name} for the fields it takes."""
        return {f.metadata.get("kw") or f.name: f.name for f in dataclasses.fields(cls) if f.metadata.get("kw") != ""}

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
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("to") == target}


def refusing(ok: Callable[[Any], bool], want: str) -> Check:
    """A check that keeps a value ``ok`` accepts and refuses any other: "<keyword> must be <want>"."""
    def check(v: Any, name: str) -> Any:
        if not ok(v):
            raise ValueError(f"{name} must be {want}, got {v!r}")
        return v
    return check


def integer(least: int, why: str = "") -> Check:
    return refusing(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least,
                    f"an integer >= {least}{why}")


seconds = refusing(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
                   "a number of seconds >= 0")
# Not a truth test: that took "no" for True and None for False.
switch = refusing(lambda v: isinstance(v, bool), "True or False")


def one_of(*allowed: Any) -> Check:
    """One of ``allowed`` (True is not 1 here)."""
    said = ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"
    return refusing(lambda v: any(v is a or (type(v) is type(a) and v == a) for a in allowed), said)


def function_or_none(what: str) -> Check:
    return refusing(lambda v: v is None or callable(v), f"{what} or None")
