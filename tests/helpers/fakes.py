"""A kernel recorder and a host clock that tests control (torch.profiler's CUDA activity needs a
GPU), and TE's autocast for sweeps on a CPU (TE cannot run there)."""

import contextlib

from te_gemm_callback.capture.kernel_profile import split_at_marks


class FakeKernels:
    """What CUPTI would record for steps of MLP: 6 GEMM kernels (fprop up/down, then backward
    down dgrad/wgrad, up dgrad/wgrad, in the order autograd runs them) between other kernels.
    GEMM kernel i lasts (i + 1) * 100 µs, so the join can be read back exactly. A warm-up step
    before the first marker records GEMMs of 1 µs, which must not reach any measured step."""

    def __init__(self, gemms=6, clock=None, start_s=0.0, stop_s=0.0):
        self.gemms, self.running, self.error, self.started, self.marks = gemms, False, None, 0, 0
        # A fake clock advanced by the session's start and stop (CUPTI's set-up; its sync and
        # records read), so where that time lands can be checked.
        self.clock, self.start_s, self.stop_s = clock, start_s, stop_s

    def start(self):
        self.running, self.started, self.marks = True, self.started + 1, 0
        if self.clock is not None:
            self.clock.t += self.start_s
        return True

    def mark(self):
        self.marks += self.running

    def stop(self):
        self.running = False
        if self.clock is not None:
            self.clock.t += self.stop_s
            self.sync_ms = self.stop_s * 1e3 / 2  # half of it waiting for the GPU, say
        ks, t = [], 0.0
        for step in range(self.marks + 1):
            if step:
                ks.append(("at::cuda::(anonymous namespace)::spin_kernel(long)", t, t + 2.0))
            for i in range(self.gemms):
                ks.append(("vectorized_elementwise_kernel", t + 3.0, t + 5.0))
                ks.append((f"nvjet_hsh_{i}_gemm", t + 10.0, t + 10.0 + ((i + 1) * 100.0 if step else 1.0)))
                t += 1000.0
        return split_at_marks(ks, self.marks)

    def discard(self):
        self.running = False


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeAutocast:
    """TE's autocast cannot run on CPU: this stand-in keeps the stack of recipes entered, so a module
    can tell which precision its forward ran under (a plan's modules must see BF16)."""

    def __init__(self):
        self.stack = []

    def __call__(self, recipe):
        @contextlib.contextmanager
        def ctx():
            self.stack.append(recipe)
            try:
                yield
            finally:
                self.stack.pop()

        return ctx()


def fake_te_sweep(monkeypatch):
    """The sweep module with TE's recipes made available on a CPU model: (sweep, autocast stand-in)."""
    from te_gemm_callback import precisions
    from te_gemm_callback.precisions import Availability
    from te_gemm_callback.sweep import engine as sweep

    fake = FakeAutocast()
    monkeypatch.setattr(sweep, "autocast", fake)
    monkeypatch.setattr(precisions, "autocast", fake)  # the plan's BF16 wrapper imports it from here
    monkeypatch.setattr(sweep, "availability", lambda r: Availability(r, True))
    monkeypatch.setattr(sweep, "_on_cuda", lambda m: True)  # FP8 recipes are swept only on a GPU
    return sweep, fake


def profiler_that_cannot_start(monkeypatch, module):
    """Make ``module``'s GemmProfiler raise when built: any failure while starting a capture."""

    def broken(*args, **kwargs):
        raise RuntimeError("cannot start")

    monkeypatch.setattr(module, "GemmProfiler", broken)


def start_warnings(caplog):
    """The te_gemm_callback warnings that a capture could not start."""
    return [r.getMessage() for r in caplog.records
            if r.name == "te_gemm_callback" and "could not start capturing" in r.getMessage()]
