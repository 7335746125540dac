"""The compute profiler on a real (tiny) run of the zoo MLP, its CLI, and the
factory loader's errors."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch", reason="the profiler needs torch: pip install 'thrifty[torch]'")

from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.measure import zoo  # noqa: E402
from thrifty.perfmodels.profile import load_profile, save_profile  # noqa: E402
from thrifty.runtime.measure.profiler import (  # noqa: E402
                                              as_workload,
                                              geometric_batches,
                                              load_factory,
                                              load_workload,
                                              profile_workload,
                                              search_max_batch,
                                              )
from thrifty.runtime import cli  # noqa: E402

BATCHES = [1, 16, 128]


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    """One real profile of the zoo MLP, saved and loaded back."""
    profile = profile_workload(
        zoo.mlp(), model_name="mlp", batches=BATCHES, repeats=2, warmup=1, ready_repeats=2, device="cpu", progress=False
    )
    path = tmp_path_factory.mktemp("profiles") / "mlp__cpu.json"
    save_profile(profile, path)
    return load_profile(path)


def test_profile_is_valid_and_measured(mlp_profile):
    assert mlp_profile.model == "mlp"
    assert mlp_profile.device == "cpu"
    assert [p.batch for p in mlp_profile.points] == BATCHES
    assert mlp_profile.max_batch == BATCHES[-1]
    assert mlp_profile.provenance.kind == "measured"
    assert "torch" in mlp_profile.provenance.machine
    assert all(p.repeats == 2 for p in mlp_profile.points)


def test_latencies_positive_and_growing_with_batch(mlp_profile):
    points = mlp_profile.points
    assert all(p.forward_s > 0 and p.backward_s > 0 for p in points)
    assert mlp_profile.step_s > 0
    # 128x the samples: the iteration must take clearly longer than at the small batches. Each point is the
    # mean of 2 timed passes, so one pass slowed by another process can lift one point (in one CI run batch 1
    # took 15 ms against batch 128's 13 ms): the largest batch is compared with the fastest of the others.
    passes = [p.forward_s + p.backward_s for p in points]
    assert passes[-1] > 1.5 * min(passes[:-1])


def test_ready_fractions_ordered_and_last_layer_first(mlp_profile):
    fractions = [layer.ready_frac for layer in mlp_profile.layers]
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert fractions == sorted(fractions)
    names = [name for name, _p in zoo.mlp().model.named_parameters()]
    last_layer = {n for n in names if n.startswith(names[-1].split(".")[0] + ".")}
    assert {layer.name for layer in mlp_profile.layers[: len(last_layer)]} == last_layer
    first_layer = {n for n in names if n.startswith(names[0].split(".")[0] + ".")}
    assert {layer.name for layer in mlp_profile.layers[-len(first_layer) :]} == first_layer


def test_gradient_bytes_are_the_parameter_bytes(mlp_profile):
    model = zoo.mlp().model
    assert len(mlp_profile.layers) == len(list(model.parameters()))
    assert mlp_profile.total_grad_bytes == sum(p.numel() * p.element_size() for p in model.parameters())


def test_profiling_leaves_the_callers_model_untouched():
    workload = zoo.mlp()
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    profile_workload(workload, model_name="mlp", batches=[1, 2], repeats=1, warmup=0, ready_repeats=1, progress=False)
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_zoo_is_deterministic_given_a_seed():
    for factory in zoo.FACTORIES.values():
        a, b = factory(seed=3), factory(seed=3)
        assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
        (xa, ya), (xb, yb) = a.make_batch(4), b.make_batch(4)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        loss = a.loss_fn(a.model(xa), ya)
        assert loss.ndim == 0 and torch.isfinite(loss)


def test_geometric_batches():
    assert geometric_batches(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert geometric_batches(48) == [1, 2, 4, 8, 16, 32, 48]


def test_search_max_batch_finds_the_largest_that_fits():
    assert search_max_batch(lambda b: b <= 300, cap=4096) == 300
    assert search_max_batch(lambda b: b <= 300, cap=100) == 100
    assert search_max_batch(lambda b: False, cap=64) is None


def test_memory_limit_caps_max_batch_on_cpu():
    # The MLP's state (weights, gradients, momentum) is ~31 MB; 64 MB leaves room
    # for some thousands of samples of ~20 KB of activations each, not 2**20.
    profile = profile_workload(
        zoo.mlp(), model_name="mlp", max_batch=2, repeats=1, warmup=0, ready_repeats=1,
        memory_limit_bytes=64 * 2**20, progress=False,
    )
    assert profile.extra["max_batch_source"] == "memory_estimate"
    assert 2 < profile.max_batch < 2**20


# --- the CLI ------------------------------------------------------------------------


def test_cli_writes_a_profile(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    argv = ["profile", "thrifty.runtime.measure.zoo:mlp", "--out", str(out), "--batches", "1,4"]
    code = cli.main(argv + ["--repeats", "1", "--warmup", "0", "--no-progress"])
    assert code == 0
    profile = load_profile(out)
    assert profile.model == "mlp"
    assert [p.batch for p in profile.points] == [1, 4]
    assert profile.provenance.command.startswith("thrifty profile thrifty.runtime.measure.zoo:mlp --out ")
    assert "--batches 1,4 --repeats 1 --warmup 0" in profile.provenance.command
    assert "fwd ms" in capsys.readouterr().out


def test_cli_bad_factory_exits_2(tmp_path, capsys):
    code = cli.main(["profile", "thrifty.runtime.measure.zoo:nope", "--out", str(tmp_path / "x.json"),
                     "--no-progress"])
    assert code == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_cli_bad_batches_exits_2(tmp_path, capsys):
    code = cli.main(["profile", "thrifty.runtime.measure.zoo:mlp", "--out", str(tmp_path / "x.json"),
                     "--batches", "1,x"])
    assert code == 2
    assert "--batches" in capsys.readouterr().err


# --- factory specs ------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """An importable module ``thrifty_test_factories`` with good and bad factories."""
    (tmp_path / "thrifty_test_factories.py").write_text(
        textwrap.dedent(
            """
            import types
            from thrifty.runtime.measure import zoo

            def raises():
                raise RuntimeError("no GPU today")

            def returns_number():
                return 42

            def returns_tuple():
                w = zoo.mlp()
                return (w.model, w.make_batch, w.loss_fn)

            def returns_namespace():
                w = zoo.mlp()
                return types.SimpleNamespace(model=w.model, make_batch=w.make_batch, loss_fn=w.loss_fn)

            def returns_bad_model():
                w = zoo.mlp()
                return ("not a model", w.make_batch, w.loss_fn)

            NOT_CALLABLE = 3
            """
        )
    )
    (tmp_path / "thrifty_test_broken.py").write_text("raise ValueError('broken on import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "thrifty_test_factories"


@pytest.mark.parametrize("spec", ["thrifty.runtime.measure.zoo", "thrifty.runtime.measure.zoo:", ":mlp", "a b:c",
                                  "zoo:mlp()",
                                  ""])
def test_malformed_spec(spec):
    with pytest.raises(ProblemError, match="must be 'package.module:function'"):
        load_factory(spec)


def test_missing_module():
    with pytest.raises(ProblemError, match="no module named 'thrifty_no_such_module'"):
        load_factory("thrifty_no_such_module:make")


def test_module_that_fails_to_import(user_module):
    with pytest.raises(ProblemError, match="raised ValueError: broken on import"):
        load_factory("thrifty_test_broken:make")


def test_missing_attribute_suggests_close_names():
    with pytest.raises(ProblemError, match="did you mean 'mlp'"):
        load_factory("thrifty.runtime.measure.zoo:mpl")


def test_attribute_not_callable(user_module):
    with pytest.raises(ProblemError, match="must be a callable"):
        load_factory(f"{user_module}:NOT_CALLABLE")


def test_factory_that_raises_is_wrapped(user_module):
    factory = load_factory(f"{user_module}:raises")
    with pytest.raises(ProblemError, match="raised RuntimeError: no GPU today") as info:
        factory()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_factory_returning_a_non_workload(user_module):
    with pytest.raises(ProblemError, match="returned a value of type int, but must return a Workload"):
        load_workload(f"{user_module}:returns_number")


def test_factory_returning_a_bad_model(user_module):
    with pytest.raises(ProblemError, match="model is a str, but must be a torch.nn.Module"):
        load_workload(f"{user_module}:returns_bad_model")


@pytest.mark.parametrize("name", ["returns_tuple", "returns_namespace"])
def test_other_workload_shapes_are_accepted(user_module, name):
    workload = load_workload(f"{user_module}:{name}")
    assert isinstance(workload, zoo.Workload)
    assert as_workload(workload) is workload


def test_colocated_workers_measure_the_same_sweep_together():
    profile = profile_workload(
        zoo.mlp(), model_name="mlp", batches=[2, 8], repeats=2, warmup=1, rounds=1, ready_repeats=1,
        device="cpu", progress=False, colocated=2, factory="thrifty.runtime.measure.zoo:mlp",
    )
    shared = profile.colocated
    assert shared is not None and shared.workers == 2 and shared.exchange  # they exchanged gradients as DDP does
    assert [p.batch for p in shared.points] == [2, 8]
    assert all(p.repeats == 4 and p.forward_s > 0 and p.backward_s > 0 for p in shared.points)  # 2 workers x 2
    assert profile.buffer_bytes == 0  # the MLP has no buffers


def test_colocated_needs_the_factory():
    with pytest.raises(ProblemError, match="factory"):
        profile_workload(zoo.mlp(), model_name="mlp", batches=[2, 8], device="cpu", progress=False, colocated=2)


def test_ddp_overhead_is_measured_against_the_plain_model():
    from thrifty.runtime.measure.profiler import measure_ddp_overhead

    # the MLP's 10 MB of gradients are copied into DDP's buckets and back: about a millisecond here
    seconds = measure_ddp_overhead("thrifty.runtime.measure.zoo:mlp", "cpu", batch=8, warmup=3, repeats=30,
                                   threads=1)
    assert 0 < seconds < 0.1
