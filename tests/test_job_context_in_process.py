"""The job contract's iteration boundary in this process (a one-rank gloo
world on a TCPStore here, no workers): the starter's stop lands at the flag
exchange that follows it without a store round trip at any exchange, and a
loop's unequal batch shares weigh its gradients exactly (the communication
hook) whatever its model returns and whatever its loss is made of."""

from __future__ import annotations

import copy
import dataclasses
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch", reason="the job contract needs torch; pip install -e '.[all]'")
dist = pytest.importorskip("torch.distributed")

from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.ddp.context import JobContext, StopJob, combine_metrics, combine_records  # noqa: E402
from thrifty.runtime.ddp.job import STOP, JobSpec  # noqa: E402
from thrifty.runtime.worlds import RankChannel, leave_group  # noqa: E402
from thrifty.runtime.worlds.rank import command_key  # noqa: E402


@pytest.fixture
def world():
    """A one-rank gloo world: (the starter's store, the rank's channel)."""
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timedelta(seconds=30))
    dist.init_process_group("gloo", store=client, rank=0, world_size=1)
    try:
        yield server, RankChannel(client, 0, 1)
    finally:
        leave_group()  # after the test's DDP models, never by them (its docstring says why)


def _context(channel, tmp_path, batches=(16,)):
    """The context of rank 0 (of a world with local `batches`, in this one-rank world)."""
    job = JobSpec(trainer="tests:loop", global_batch=sum(batches), iterations=1000, checkpoint_every=None,
                  checkpoint_path=str(tmp_path / "c.pt"), restore="never", backend="gloo")
    return JobContext(job, channel, torch.device("cpu"), False, sum(batches), list(batches))


def test_training_forwards_between_two_draws_must_add_up_to_the_ranks_batch_or_each_hold_it(world, tmp_path):
    _, channel = world
    ctx = _context(channel, tmp_path, batches=(5, 3))
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    model(torch.randn(7, 2)).sum().backward()  # before the first draw: not the plan's batches yet
    batches = iter(ctx.prepare_loader(torch.utils.data.TensorDataset(torch.randn(24, 2))))
    (x,) = next(batches)
    for part in x.tensor_split(3):  # 2 + 2 + 1
        model(part).sum().backward()
    next(batches)
    for _ in range(2):  # the whole batch, twice (a sharpness-aware step), given by name
        model(input=x).sum().backward()
    with torch.no_grad():
        model(x[:1])  # an evaluation is no training
    model.eval()
    model(x[:3])
    model.train()
    ctx.report({"loss": 1.0})
    next(batches)
    model(x[:2]).sum().backward()
    model(x[:2]).sum().backward()  # 4 of 5
    with pytest.raises(ProblemError, match=r"2 forward passes of shapes \(2, 2\), \(2, 2\) between two draws .*"
                                           r"the plan gives this rank 5 samples"):
        next(batches)


def test_the_batch_check_covers_a_worlds_first_draws_then_one_in_sixteen(world, tmp_path):
    _, channel = world
    ctx = _context(channel, tmp_path, batches=(4,))
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    drawn = []
    with pytest.raises(ProblemError, match=r"trained on a batch of shape \(2, 2\), but the plan gives this rank 4"):
        for (x,) in ctx.prepare_loader(torch.utils.data.TensorDataset(torch.randn(64, 2))):
            drawn.append(ctx.step - 1)
            model(x[:2] if drawn[-1] >= 40 else x).sum().backward()  # from the draw of step 40 on, half a batch
            ctx.report({"loss": 1.0})
    assert drawn[-1] == 48  # the draws of steps 40 to 47 went unchecked; 48's forward was checked at the next draw


def test_a_loop_that_stops_reporting_is_stopped_at_its_unreported_limit(world, tmp_path):
    _, channel = world
    ctx = _context(channel, tmp_path, batches=(4,))
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    with pytest.raises(ProblemError, match="drew 100 iterations without calling ctx.report"):
        for step, (x,) in enumerate(ctx.prepare_loader(torch.utils.data.TensorDataset(torch.randn(64, 2)))):
            model(x).sum().backward()
            if step < 20:
                ctx.report({"loss": 1.0})
    assert ctx.step == 120 and ctx._reports == 20


def test_the_usual_metric_buffers_combine_as_the_general_merge_does():
    batches = [3, 5]
    first = [(i, {"loss": i * 0.1, "acc": 0.5}) for i in range(1, 6)]
    second = [(i, {"loss": i * 0.3, "acc": 0.7}) for i in range(1, 6)]
    assert combine_records([first, second], batches) == \
        [(i, combine_metrics([a, b], batches)) for (i, a), (_, b) in zip(first, second)]
    assert combine_records([first], [3]) == first
    # a name one rank lacks, an iteration reported twice (the later report's values win), a rank without it
    merged = dict(combine_records([first + [(5, {"loss": 9.0})], second[:-1] + [(4, {"f1": 0.2})]], batches))
    assert list(merged) == [1, 2, 3, 4, 5]
    assert merged[5] == {"loss": 9.0, "acc": 0.5}
    assert merged[4] == {**combine_metrics([first[3][1], second[3][1]], batches), "f1": 0.2}


def test_a_stop_lands_at_the_report_after_the_exchange_carrying_it_without_a_store_read(world, tmp_path, monkeypatch):
    server, channel = world
    # an exchange reads the stop its rank's watch thread saw: never a round trip to the starter's store
    monkeypatch.setattr(RankChannel, "command", lambda self, name: pytest.fail("a store round trip at an exchange"))
    ctx = _context(channel, tmp_path)
    model = ctx.prepare_model(torch.nn.Linear(4, 2))
    state = {"model": model}
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    asked_at, started = None, []  # the report from which rank 0 knows the stop; the reports that start an exchange
    with pytest.raises(StopJob):
        for inputs, targets in ctx.prepare_loader(data):
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            if ctx.iteration == 5:
                server.set(command_key(STOP), "1")  # the starter asks
                limit = time.monotonic() + 10
                while ctx._stop.given is None and time.monotonic() < limit:
                    time.sleep(0.001)
                asked_at = ctx._reports + 1
            ctx.report({"loss": 1.0}, checkpoint=state)
            if ctx._exchanged[0] == ctx._reports:
                started.append(ctx._reports)
    assert ctx._stop.given == "1"
    carrying = next(r for r in started if r >= asked_at)  # the first exchange to start after the stop was seen
    assert started[-1] == carrying and ctx._reports == carrying + 1  # every rank acts at the report after it
    assert torch.load(tmp_path / "c.pt", weights_only=False)["iteration"] == ctx.iteration  # after a checkpoint


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    note: str = "x"


class _Opaque:  # an output no weighting at the outputs could look into
    def __init__(self, logits):
        self.logits = logits


class _Net(torch.nn.Module):
    """A linear layer whose output `wrap` returns; it keeps an auxiliary loss of its own output (as
    mixture-of-experts layers keep their balancing loss), which reaches the parameters around the output."""

    def __init__(self, wrap):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.wrap = torch.nn.Linear(4, 3), wrap
        self.aux = torch.zeros(())

    def forward(self, x):
        y = self.linear(x)
        self.aux = y.pow(2).mean()
        return self.wrap(y)


WRAPS = {"tensor": lambda y: y, "tuple": lambda y: (y, None, 3), "dict": lambda y: {"logits": [y], "n": 1.0},
         "dataclass": _Out, "opaque": _Opaque}


def _logits(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple):
        return out[0]
    if isinstance(out, dict):
        return out["logits"][0]
    return out.logits


@pytest.mark.parametrize("aux", [False, True], ids=["loss-of-outputs", "auxiliary-loss"])
@pytest.mark.parametrize("wrap", list(WRAPS))
def test_unequal_shares_weigh_the_gradient_whatever_the_output_and_the_loss(world, tmp_path, wrap, aux):
    """Rank 0 of a world with local batches (6, 10) weighs its gradient by
    ``6 / 16`` (the communication hook; W = 1 here), whatever its model
    returns, also when a term of the loss (a module's auxiliary loss)
    reaches the parameters around the model's outputs."""
    _, channel = world
    ctx = _context(channel, tmp_path, batches=(6, 10))
    ddp = ctx.prepare_model(_Net(WRAPS[wrap]))
    reference = _Net(WRAPS[wrap])
    x, target = torch.randn(6, 4), torch.randn(6, 3)
    for _ in range(2):
        ddp.zero_grad()
        reference.zero_grad()
        for net, model in ((ddp, ddp.module), (reference, reference)):
            loss = torch.nn.functional.mse_loss(_logits(net(x)), target)
            (loss + model.aux if aux else loss).backward()
        for mine, theirs in zip(ddp.parameters(), reference.parameters()):
            assert torch.allclose(mine.grad, theirs.grad * 6 / 16, rtol=1e-6, atol=0)
    assert ddp._get_ddp_logging_data().get("comm_hook") is not None


def test_the_hook_weighs_every_bucket_of_a_model_with_several(world, tmp_path):
    """With several gradient buckets (each hook starts its bucket's
    all-reduce; the last one waits for them all) every bucket comes back
    summed and weighted, also after micro-batches accumulated under
    ``no_sync``."""
    _, channel = world
    ctx = _context(channel, tmp_path, batches=(6, 10))
    torch.manual_seed(0)
    # a 600 x 600 layer outgrows DDP's first bucket (1 MB): the gradients travel in more than one
    reference = torch.nn.Sequential(torch.nn.Linear(4, 600), torch.nn.Tanh(), torch.nn.Linear(600, 600),
                                    torch.nn.Tanh(), torch.nn.Linear(600, 3))
    ddp = ctx.prepare_model(copy.deepcopy(reference))
    x, target = torch.randn(6, 4), torch.randn(6, 3)
    for _ in range(3):  # DDP rebuilds its buckets after the first iteration: two from the second on
        ddp.zero_grad()
        reference.zero_grad()
        with ddp.no_sync():
            torch.nn.functional.mse_loss(ddp(x[:2]), target[:2]).mul(2 / 6).backward()
        torch.nn.functional.mse_loss(ddp(x[2:]), target[2:]).mul(4 / 6).backward()
        torch.nn.functional.mse_loss(reference(x), target).backward()
        for mine, theirs in zip(ddp.parameters(), reference.parameters()):
            assert torch.allclose(mine.grad, theirs.grad * 6 / 16, rtol=1e-5, atol=1e-7)  # micro-batches round apart
    assert "," in ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]  # more than one bucket
