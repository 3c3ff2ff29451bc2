"""KernelProfile and Kineto's TEARDOWN_CUPTI: the variable must outlive the session.

Kineto finalizes CUPTI on a background thread after a session and reads TEARDOWN_CUPTI again
there; unset by then, it subscribes CUPTI's callbacks anew and every later kernel launch of the
job costs more host time (measured on the H200, see docs/results/h200.md). These run on CPU, where
torch.profiler refuses a CUDA-only session: a stand-in session (no records) takes its place; the
variable's handling is KernelProfile's own code either way.
"""

from __future__ import annotations

import os

import pytest

from te_gemm_callback.capture.kernel_profile import KernelProfile, KernelStep


class _Session:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def events(self):
        return []


@pytest.fixture
def clean_env(monkeypatch):
    import torch

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    monkeypatch.setattr(torch.profiler, "profile", _Session)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    yield


def test_teardown_variable_stays_set_after_the_session(clean_env):
    kp = KernelProfile()
    assert kp.start()
    assert os.environ["TEARDOWN_CUPTI"] == "1"
    assert kp.stop() == [KernelStep([])]
    assert os.environ.get("TEARDOWN_CUPTI") == "1", "unset after stop(): Kineto's teardown thread re-subscribes CUPTI"


def test_teardown_variable_stays_set_after_a_discarded_session(clean_env):
    kp = KernelProfile()
    kp.start()
    kp.discard()
    assert os.environ.get("TEARDOWN_CUPTI") == "1"


def test_users_own_setting_wins(clean_env, monkeypatch):
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # e.g. CUDA graphs with an older CUDA
    kp = KernelProfile()
    kp.start()
    kp.stop()
    assert os.environ["TEARDOWN_CUPTI"] == "0"


def test_failed_start_leaves_the_environment_as_it_was(clean_env, monkeypatch):
    import torch

    class Broken:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            raise RuntimeError("another profiler is running")

    monkeypatch.setattr(torch.profiler, "profile", Broken)
    kp = KernelProfile()
    assert not kp.start()
    assert "another profiler" in kp.error
    assert "TEARDOWN_CUPTI" not in os.environ
