"""The reweighting communication hooks (`thrifty.runtime.ddp.reweight`, and
the C++ one of `thrifty.runtime.ddp.native`) on a model of several DDP
buckets, its gradients as views of them (as `data_parallel` wraps a model):
every bucket is weighted by ``b_r / B`` and summed; the Python hook waits
for the last one itself on host tensors and chains the others on their
all-reduce's future. In this process, on a gloo group of one, so the sum is
the rank's own weighted gradient; the training runtime's process tests check
the sum over ranks against one device (1e-6). The C++ hook is built before
the tests (`tests/conftest.py`); its tests skip where it did not build."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from thrifty.runtime.ddp import native, reweight  # noqa: E402
from thrifty.runtime.worlds import leave_group  # noqa: E402
from thrifty.runtime.worlds import rank as rank_module  # noqa: E402


@pytest.fixture
def group():
    kept = list(rank_module._KEPT_GROUPS)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    gc.collect()
    leave_group()
    rank_module._KEPT_GROUPS[:] = kept


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 4))


def _gradients(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    for inputs, targets in batches:
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _weighted_steps(ddp: DistributedDataParallel) -> None:
    """Three SGD steps of `ddp` (weight 1/4) beside the plain model at a quarter of the learning rate: the
    same parameters, and at every step gradients a quarter of the plain model's."""
    plain = _net()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    reference = torch.optim.SGD(plain.parameters(), lr=0.1 * 0.25)
    generator = torch.Generator().manual_seed(4)
    for _ in range(3):
        batch = [(torch.randn(16, 64, generator=generator), torch.randint(0, 4, (16,), generator=generator))]
        optimizer.zero_grad()
        reference.zero_grad()
        for g, w in zip(_gradients(ddp, batch), _gradients(plain, batch), strict=True):
            torch.testing.assert_close(g, 0.25 * w, rtol=1e-5, atol=1e-7)
        optimizer.step()
        reference.step()


def test_every_bucket_is_weighted_and_summed_the_last_waited_for_the_others_chained(group):
    state = reweight.register_reweighting(reweight.data_parallel(_net()), 16, 64)
    assert state.wait_last and state.weight == 0.25  # host tensors: the last bucket is waited for in the hook
    seen: list[bool] = []

    def counted(s, bucket):  # no annotations: DDP checks the bucket's, and this module postpones them
        seen.append(bucket.is_last())
        return reweight.batch_weighted_allreduce(s, bucket)

    ddp = DistributedDataParallel(_net(), gradient_as_bucket_view=True, bucket_cap_mb=0.1)
    ddp.register_comm_hook(state, counted)
    _weighted_steps(ddp)  # DDP rebuilds its buckets after the first step; gradients freed between
    assert seen.count(True) == 3 and seen.count(False) >= 2  # a last bucket an iteration; others once DDP rebuilt them


def test_micro_batches_under_no_sync_are_weighted_once_when_they_are_summed(group):
    ddp = reweight.data_parallel(_net())
    reweight.register_reweighting(ddp, 16, 64)
    plain = _net()
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 64, generator=generator), torch.randint(0, 4, (8,), generator=generator))
               for _ in range(2)]
    with ddp.no_sync():
        _gradients(ddp, batches[:1])
    got, want = _gradients(ddp, batches[1:]), _gradients(plain, batches)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, 0.25 * w, rtol=1e-6, atol=1e-7)


def test_data_parallel_keeps_the_gradients_as_views_of_the_buckets(group):
    ddp = reweight.data_parallel(_net())
    assert ddp.gradient_as_bucket_view
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        ddp(torch.randn(4, 64)).sum().backward()
        optimizer.step()
    storages = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters()}
    assert len(storages) < len(list(ddp.parameters()))  # the gradients share their buckets' memory


def test_the_hook_s_float32_factor_weighs_exactly_as_the_python_float_would():
    state = reweight.ReweightState(reweight.batch_weight(16, 48))  # 1/3: not exact in binary
    bucket = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    assert torch.equal(bucket.clone().mul_(state.factor), bucket.clone().mul_(state.weight))
    assert state.factor.dtype == torch.float32 and state.factor.dim() == 0


@pytest.mark.parametrize("native_hook", [True, False], ids=["C++ hook", "Python hook"])
def test_both_hooks_weigh_every_bucket(group, native_hook):
    ddp = DistributedDataParallel(_net(), gradient_as_bucket_view=True, bucket_cap_mb=0.1)
    state = reweight.register_reweighting(ddp, 16, 64, native=native_hook)
    if native_hook and not state.native:
        pytest.skip("the C++ hook did not build on this machine (a C++ compiler and ninja are needed); the Python "
                    "hook stands in, and its test runs")
    assert state.native is native_hook
    _weighted_steps(ddp)


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """`thrifty.runtime.ddp.native` as in a fresh process, its cache in `tmp_path`."""
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_a_hook_that_cannot_be_built_leaves_the_python_hook_says_so_and_is_not_built_again(fresh_native, monkeypatch,
                                                                                           caplog):
    source = fresh_native / "weighted_hook.cpp"
    source.write_text("#error no C++ hook here\n")
    monkeypatch.setattr(native, "SOURCE", source)
    with caplog.at_level("WARNING", logger=native.__name__):
        assert native.weighted_hook() is None
    assert "the Python hook weighs the gradients instead" in caplog.text
    failed = native.extension_dir(torch.__version__) / native.FAILED
    assert failed.exists()
    monkeypatch.setattr(native, "_loaded", {})  # another process: the kept failure, no second build
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda *a, **k: pytest.fail("built again"))
    assert native.weighted_hook() is None


def test_the_switch_turns_the_c_hook_off(group, fresh_native, monkeypatch):
    monkeypatch.setenv(native.ENABLE_ENV, "0")
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda *a, **k: pytest.fail("built though turned off"))
    ddp = DistributedDataParallel(_net(), gradient_as_bucket_view=True, bucket_cap_mb=0.1)
    assert not reweight.register_reweighting(ddp, 16, 64).native
    _weighted_steps(ddp)
