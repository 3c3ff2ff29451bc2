"""Which of a model's GEMM-bearing modules a capture saw, missed, or could not see."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torch import nn

from te_gemm_callback.capture.scope import bears_gemm, display_names, is_te_module, wrapper_attr
from te_gemm_callback.printable import plain

log = logging.getLogger("te_gemm_callback")


def _names(ns: list[str]) -> str:
    # plain(): a module name must not drive the terminal. The root's name is "".
    return plain(", ".join(n or "(the model itself)" for n in ns[:8])) + (" ..." if len(ns) > 8 else "")


def coverage(model: nn.Module, seen: Iterable[str], *, te_watched: bool, torch_watched: bool,
             warn: bool) -> dict[str, Any]:
    """``gemm_modules`` (count), ``never_ran`` and ``not_watched`` (names): TE modules are watched
    with ``te_watched``, the others with ``torch_watched`` (dispatch steps); a watched module not in
    ``seen`` never ran a GEMM. ``warn``: one warning each."""
    seen = set(seen)
    shown = display_names(model)
    gemm = {shown[n]: is_te_module(m) for n, m in model.named_modules()
            if bears_gemm(m) and wrapper_attr(m) is None}
    watched = {n for n, te_mod in gemm.items() if (te_watched if te_mod else torch_watched)}
    never_ran = [n for n in gemm if n in watched and n not in seen]
    not_watched = [n for n in gemm if n not in watched]
    if warn and never_ran:
        log.warning("te-gemm: %d GEMM-bearing module(s) never ran while capturing: %s", len(never_ran),
                    _names(never_ran))
    if warn and not_watched:
        log.warning("te-gemm: %d GEMM-bearing module(s) not captured, no adapter watched them (plain torch "
                    "GEMMs are seen on dispatch steps only, TE GEMMs with the 'te' adapter): %s", len(not_watched),
                    _names(not_watched))
    return {"gemm_modules": len(gemm), "never_ran": never_ran, "not_watched": not_watched}
