import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs: never download


@pytest.fixture(autouse=True, scope="session")
def _result_cache(tmp_path_factory):
    # The callbacks benchmark and report by default: the tests' cells go to a cache of their own,
    # never the user's (and never one test run's noisy CPU cells into the next).
    os.environ.setdefault("TE_GEMM_CACHE", str(tmp_path_factory.mktemp("cache") / "bench_cache.json"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def no_measuring(monkeypatch):
    """run_bench replaced: a test that reaches it has measured (what a refusal must come before)."""
    from te_gemm_callback.microbench import engine

    calls = []
    monkeypatch.setattr(engine, "run_bench", lambda *a, **kw: calls.append(kw) or pytest.fail("measured"))
    return calls
