"""Expert parallelism in the MoE recipe: over 2 processes (gloo, CPU), each holding half the
experts, outputs and gradients equal a single process holding all experts. Routing differs per
rank (each rank has its own tokens), so the all-to-all sends uneven splits both ways."""


import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import import_example

pytestmark = pytest.mark.multiprocess  # DDP ranks / spawned workers

H, FF, E, K, T = 16, 24, 4, 2, 20  # FF: the experts' intermediate size


def _worker(rank: int, world: int, init: str, q, collapse: bool) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        moe = import_example("moe")
        torch.manual_seed(0)
        full = moe.MoEMLP(H, FF, E, K, te_experts=False)  # same weights on both ranks
        ep = moe.MoEMLP(H, FF, E, K, te_experts=False, ep_group=dist.group.WORLD)
        lo, hi = rank * E // world, (rank + 1) * E // world
        with torch.no_grad():
            if collapse:  # equal logits: top-2 picks the same two experts, on one rank; the other gets no rows
                full.router.weight.zero_()
            ep.router.weight.copy_(full.router.weight)
            ep.w1.copy_(full.w1[lo:hi])
            ep.w2.copy_(full.w2[lo:hi])
        torch.manual_seed(100 + rank)  # each rank its own tokens
        x = torch.randn(T, H)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_full, y_ep = full(x1), ep(x2)
        y_full.square().sum().backward()
        y_ep.square().sum().backward()
        # An expert's gradient under EP gathers every rank's tokens: the sum of the full-model
        # gradients over ranks, restricted to this rank's experts.
        g1 = full.w1.grad.clone()
        dist.all_reduce(g1)
        torch.testing.assert_close(y_ep, y_full, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ep.w1.grad if ep.w1.grad is not None else torch.zeros_like(ep.w1), g1[lo:hi],
                                   rtol=1e-4, atol=1e-4)
        assert (sum(ep.routed) > 0 or collapse) and ep.expert_parameter_names("m") == ["m.w1", "m.w2"]
        q.put((rank, "ok", ep.routed))
    except Exception as err:  # report to the parent instead of hanging it
        q.put((rank, f"{type(err).__name__}: {err}", None))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("collapse", [False, True], ids=["routed", "one-rank-gets-nothing"])
def test_expert_parallel_matches_single_process(tmp_path, collapse):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"file://{tmp_path / 'pg'}"
    procs = [ctx.Process(target=_worker, args=(r, 2, init, q, collapse)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (msg, routed)) for r, msg, routed in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
    assert results[0][0] == "ok" and results[1][0] == "ok", results
    # Each rank's experts received rows from both ranks: 2 ranks x T tokens x top-k in all.
    assert sum(results[0][1]) + sum(results[1][1]) == 2 * T * K
    if collapse:
        assert 0 in (sum(results[0][1]), sum(results[1][1]))


def test_expert_parallel_recipe_rejects_uneven_split():
    moe = import_example("moe")
    try:
        moe.main(["--tiny", "--experts", "3", "--devices", "2", "--expert-parallel", "--no-bench"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("expected a usage error")
