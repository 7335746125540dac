"""`leave_group`: the default process group goes after the DDP models made
on it, never freed by one of them (a Reducer freeing its gloo group with the
GIL held can deadlock; the function's docstring says how). In this process,
on a gloo group of one."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from thrifty.runtime.measure.job_profile import ProfileTarget, _ddp_overhead  # noqa: E402
from thrifty.runtime.worlds import leave_group  # noqa: E402
from thrifty.runtime.worlds import rank as rank_module  # noqa: E402


def _trained_ddp():
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
    return model


@pytest.fixture
def group():
    """A gloo group of one in this process; the groups a test left kept are dropped after it."""
    kept = list(rank_module._KEPT_GROUPS)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    rank_module._KEPT_GROUPS[:] = kept


def test_a_group_whose_models_are_gone_is_freed_even_from_a_reference_cycle(group):
    model = _trained_ddp()
    model.__dict__["cycle"] = [model]  # freed only by a garbage collection
    del model
    assert leave_group() is True
    assert not dist.is_initialized() and all(g is not group for g in rank_module._KEPT_GROUPS)


def test_a_group_a_live_model_still_holds_is_kept_so_the_model_never_frees_it(group):
    model = _trained_ddp()
    assert leave_group() is False
    assert not dist.is_initialized() and rank_module._KEPT_GROUPS[-1] is group
    # another group can be made and left while the kept one lives on
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert leave_group() is True
    del model


def test_the_profiles_ddp_passes_leave_their_group_free_unless_the_job_keeps_its_model(monkeypatch):
    left: list[bool] = []
    monkeypatch.setattr("thrifty.runtime.worlds.leave_group", lambda: left.append(leave_group()) or left[-1])
    kept: list = []

    def loop(ctx, keep):
        model = ctx.prepare_model(torch.nn.Linear(8, 2))
        if keep:
            kept.append(model)
        for inputs, in ctx.prepare_loader(torch.utils.data.TensorDataset(torch.randn(64, 8))):
            model(inputs).sum().backward()
            ctx.report()

    before = list(rank_module._KEPT_GROUPS)
    for keep in (False, True):
        target = ProfileTarget("tests:loop", {}, loop=lambda ctx, keep=keep: loop(ctx, keep))
        assert _ddp_overhead(target, 4, torch.device("cpu"), warmup=1, repeats=2, rounds=1) >= 0.0
        assert not dist.is_initialized()
    assert left == [True, False]
    assert len(rank_module._KEPT_GROUPS) == len(before) + 1
    kept.clear()
    gc.collect()
    rank_module._KEPT_GROUPS[:] = before
