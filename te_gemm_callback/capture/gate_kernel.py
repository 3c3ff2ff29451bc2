"""The Triton kernel behind :class:`~.gate.HostGate`, in a module of its own: importing Triton takes
a while and needs a CUDA build of torch, so only a gate that is about to be used imports it."""

import triton
import triton.language as tl


@triton.jit
def gate(flag_ptr, want, seen_ptr, slot, max_polls):
    # One program: poll the host's counter in pinned memory (volatile: every read reaches host
    # memory, none is cached) until it reaches this gate's number, or give up after max_polls.
    v = tl.load(flag_ptr, volatile=True)
    i = 0
    while (v < want) & (i < max_polls):
        v = tl.load(flag_ptr, volatile=True)
        i += 1
    # What the gate saw when it let the stream go: below ``want`` means it timed out.
    tl.store(seen_ptr + slot, v)
