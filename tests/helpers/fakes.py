"""A kernel recorder and a host clock that tests control (torch.profiler's CUDA activity needs a GPU)."""

from te_gemm_callback.capture.kernel_records import split_at_marks


class FakeKernels:
    """What CUPTI would record for steps of MLP: 6 GEMM kernels (fprop up/down, then backward
    down dgrad/wgrad, up dgrad/wgrad, in the order autograd runs them) between other kernels.
    GEMM kernel i lasts (i + 1) * 100 µs, so the join can be read back exactly. A warm-up step
    before the first marker records GEMMs of 1 µs, which must not reach any measured step."""

    def __init__(self, gemms=6):
        self.gemms, self.running, self.error, self.started, self.marks = gemms, False, None, 0, 0

    def start(self):
        self.running, self.started, self.marks = True, self.started + 1, 0
        return True

    def mark(self):
        self.marks += self.running

    def stop(self):
        self.running = False
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
