"""The Triton kernel behind :class:`~.gate.HostGate`, apart: importing Triton is slow and needs CUDA torch."""

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _now():
    # The GPU's global timer (ns), the same on every SM: a timeout in time, whatever a poll costs.
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


# No specialization on the integers: a value of 1 or a multiple of 16 would compile another kernel
# inside a timed bracket.
@triton.jit(do_not_specialize=["flag_slot", "want", "seen_slot", "timeout_ns"])
def gate(flag_ptr, flag_slot, want, seen_ptr, seen_slot, timeout_ns):
    # Poll the host's slot (volatile: every read reaches host memory) for this gate's number, or time out.
    start = _now()
    v = tl.load(flag_ptr + flag_slot, volatile=True)
    while (v < want) & (_now() - start < timeout_ns):
        v = tl.load(flag_ptr + flag_slot, volatile=True)
    # The gate's number where it opened on the host's word, minus it where it gave up.
    tl.store(seen_ptr + seen_slot, tl.where(v >= want, want, -want))


def launch(flag: Any, flag_slot: int, want: int, seen: Any, seen_slot: int, timeout_ns: int) -> None:
    gate[(1,)](flag, flag_slot, want, seen, seen_slot, timeout_ns)
