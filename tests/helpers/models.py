"""Small torch models, and a loop that steps one under a GemmProfiler driven by a fake clock."""

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.checkpoint import checkpoint


class MLP(nn.Module):
    def __init__(self, h=16, i=48):
        super().__init__()
        self.up, self.down = nn.Linear(h, i), nn.Linear(i, h)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, ckpt=None):
        super().__init__()
        self.a, self.b, self.ckpt = MLP(), MLP(), ckpt

    def forward(self, x):
        if self.ckpt is None:
            return self.b(self.a(x))
        x = checkpoint(self.a, x, use_reentrant=self.ckpt == "reentrant")
        return self.b(x)


def step(model, x):
    model(x).sum().backward()


def hooks_on(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def run(prof, model, x, clock, n, instrumented_s=0.015, plain_s=0.010):
    """n training steps; each advances the fake clock by more when the capture instruments are on."""
    seen = []
    prof.start()
    for i in range(n):
        kind = prof.step_kind
        attached = hooks_on(model) > 0 or _get_current_dispatch_mode() is not None
        seen.append((kind, attached))
        model(x).sum().backward()
        clock.t += instrumented_s if attached else plain_s
        if i < n - 1:
            prof.step()
    return prof.stop(), seen
