"""Overheads of the training runtime (issue 5), and Srifty 5.4 in miniature.

1. Re-plan latency, from the preemption event to the new plan (target <= 1 s;
   Srifty gives itself 1 s): the miniature problem below, and the paper's own
   5.4 setting (ResNet-50, global batch 1024, 400 iterations, 500 s; p3.8xlarge
   spot x2, g3.8xlarge x8, g4dn.8xlarge x8 at the paper's prices; one p3 spot
   machine lost at 223 s after 200 iterations, 150 s launch + 5 s detach),
   next to the paper's answer (1 p3.8xl@512 + 8 g3.8xl@64). Each re-plan reuses
   the run's `TrainingSpace` (built while the first workers start).
2. Checkpoint time per save (model + optimizer + RNG states, atomic write with
   fsync) for the three zoo models, and as measured inside the live run.
3. Throughput of gradient reweighting against plain DDP averaging, with
   equal local batches (2 workers x 32) on a real gloo world here: DDP copies
   of the model in one world (plain; reweighting by loss scaling, the
   runtime's default; reweighting by the DDP communication hook), trained in
   turns, so the load of the host hits all alike; target overhead <= 5%.
4. Srifty 5.4 in miniature (``datasets/examples/local-demo-srifty54.json``):
   the plan puts two local-a spot machines to work, one is taken away without
   notice half way (as the paper cancelled a p3 spot instance), the runtime
   re-plans with what is left and the job must finish within its time limit
   and budget. Printed as a timeline, drawn to ``--plot``.
5. The job contract's paths (`thrifty.runtime.ddp.context`) against a
   hand-written DDP loop, on the same model, data and batches (2 workers,
   32 + 32 and 24 + 40, gloo here; ``tiny-mlp``, almost no compute, shows
   the fixed cost of an iteration): a loop function as a user writes it (the comm hook, C++ here, the
   prepared loader, a report with the loss and the state every iteration;
   with unequal batches also one that scales its own loss, ``scale_loss``),
   and the four-factory Trainer run as a loop function, each run as a job
   runs, its batches interleaved in blocks of 20 iterations with as many of
   plain DDP on one process group, so that the host's load, the other
   processes' turns and Python's garbage collections meet both alike (runs
   whose order rotates, in ``--worlds`` worlds of fresh processes); the
   time of an iteration is the mean over the blocks, and each run's ratio
   gives a 95% confidence interval; target for the loop-function path
   (as a user writes it, the default weighting): within 3% of plain DDP.

Everything runs on this host (2 CPU cores): timings move with the load of
other processes, which the table reports. Run:
``python benchmarks/runtime_overheads.py [--repeats 3] [--plot out/runtime-srifty54.png]``
(``--only-paths [--rounds 24 --models tiny-mlp]``: section 5 alone);
``--profile-now`` plans the miniature with a profile measured at the start
(for a host busier than the idle one the shipped profile was measured on).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from thrifty.runtime.training import KillWorker, ReplanInfeasible, RunConfig, read_run_log, train
from thrifty.runtime.training.replan import Replanner
from thrifty.runtime.training.report import format_timeline, plot_run, timeline
from thrifty.solver import solve
from thrifty.solver.problem import load_problem, parse_problem

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
SRIFTY_CATALOG = ROOT / "datasets" / "catalog" / "srifty-2022.json"
ZOO = "thrifty.runtime.training.examples:zoo"
console = Console(width=150)


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} CPUs"


# -- 1. re-plan latency ------------------------------------------------------------------

def srifty54_problem():
    return parse_problem({
        "kind": "training", "name": "Srifty 5.4", "model": "resnet50", "global_batch": 1024, "iterations": 400,
        "objective": "min_cost", "limits": {"time_s": 500}, "catalog": str(SRIFTY_CATALOG),
        "overheads": {"launch_s": 150},
        "instances": [{"instance_type": "p3.8xlarge", "market": "spot", "quota": 2},
                      {"instance_type": "g3.8xlarge", "market": "spot", "quota": 8},
                      {"instance_type": "g4dn.8xlarge", "market": "spot", "quota": 8}]})


def replan_latencies(problem, key, survivors, remaining, elapsed_s, spent_usd, launch_s, repeats):
    """(first latency, median of the others, the re-plan) for one preemption."""
    replanner = Replanner(problem)
    _ = replanner.space  # built at run start, while the workers start: not part of the latency
    times, replan = [], None
    for _ in range(repeats):
        replanner.depleted.clear()
        replanner.deplete(key)
        event_at = time.time()
        replan = replanner.replan("preemption", old_plan=None, remaining_iterations=remaining, elapsed_s=elapsed_s,
                                  spent_usd=spent_usd, survivors=survivors, launch_s=launch_s, event_at=event_at)
        times.append(replan.latency_s)
    return times[0], statistics.median(times[1:] or times), replan


def section_replan(repeats: int) -> list[tuple[str, str, str]]:
    rows = []
    paper = srifty54_problem()
    initial = solve(paper)
    first, median, r = replan_latencies(paper, ("p3.8xlarge", "spot"), {("p3.8xlarge", "spot"): 1}, 200, 223.0,
                                        initial.predicted.cost_usd * 0.5, 155.0, repeats)
    console.print(f"Srifty 5.4 at paper scale: initial plan {initial.config} (paper: 2xp3.8xlarge@512), "
                  f"predicted {initial.predicted.total_s:.0f} s; after losing one p3 spot machine at 223 s: "
                  f"{r.new_config} (paper: 1xp3.8xlarge@512+8xg3.8xlarge@64), predicted "
                  f"{r.new_plan.predicted.total_s:.0f} s of the {r.problem.limits.time_s:.0f} s left")
    rows.append(("re-plan latency, Srifty 5.4 at paper scale (first / median)",
                 f"{first * 1e3:.0f} ms / {median * 1e3:.0f} ms", "<= 1 s"))
    demo = load_problem(DEMO)
    first, median, r = replan_latencies(demo, ("local-a", "spot"), {("local-a", "spot"): 1}, 300, 14.0, 0.01, 5.0,
                                        repeats)
    rows.append(("re-plan latency, miniature (first / median)", f"{first * 1e3:.0f} ms / {median * 1e3:.0f} ms",
                 "<= 1 s"))
    return rows


# -- 2. checkpoints ----------------------------------------------------------------------

def section_checkpoints(repeats: int) -> list[tuple[str, str, str]]:
    import torch

    from thrifty.runtime.measure.zoo import FACTORIES
    from thrifty.runtime.ddp.checkpoint import capture_rng, save_checkpoint

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, factory in FACTORIES.items():
            model = factory(seed=0).model
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            x, y = factory(seed=0).make_batch(8)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()  # momentum buffers exist, as in a run
            times, size = [], 0
            for _ in range(max(repeats, 5)):
                seconds, size = save_checkpoint(Path(folder) / f"{name}.pt", {
                    "iteration": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "rng": {"batches": [32, 32], "states": [capture_rng(), capture_rng()]}})
                times.append(seconds)
            rows.append((f"checkpoint save, {name} ({size / 1e6:.1f} MB)",
                         f"{statistics.median(times) * 1e3:.1f} ms (median of {len(times)})", "-"))
    return rows


# -- 3. reweighting hook against plain DDP -----------------------------------------------

VARIANTS = ("plain", "batch", "hook")


def ab_rank(argv: list[str]) -> None:
    """One rank of the A/B world (a worker world's rank)."""
    from thrifty.runtime.worlds import serve_rank

    model, iterations = argv[0], int(argv[1])
    serve_rank(lambda channel: channel.finish(ab_worker(channel, model, iterations)))


def ab_worker(channel: "object", model: str, iterations: int) -> dict[str, list[float]]:
    """Three DDP copies of the model on one process group (plain averaging;
    reweighting by loss scaling, the runtime's default; reweighting by the
    communication hook), trained in turns whose order flips every iteration,
    on equal batches, so that load drifts on the host hit all alike: the
    per-iteration times of each."""
    import functools

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from thrifty.runtime.worlds import join_world
    from thrifty.runtime.measure.zoo import FACTORIES
    from thrifty.runtime.ddp.reweight import loss_scale, register_reweighting
    from thrifty.runtime.ddp.steps import scaled_loss, train_step

    torch.set_num_threads(1)
    join_world(channel, "gloo", 300.0)
    copies = {name: FACTORIES[model](seed=0) for name in VARIANTS}
    ddp = {name: DistributedDataParallel(w.model) for name, w in copies.items()}
    register_reweighting(ddp["hook"], 32, 64)
    losses = {name: w.loss_fn for name, w in copies.items()}
    losses["batch"] = functools.partial(scaled_loss, copies["batch"].loss_fn, loss_scale(32, 64, 2))
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for name, m in ddp.items()}
    batches = [copies["plain"].make_batch(32) for _ in range(4)]
    warmup, times = 5, {name: [] for name in VARIANTS}
    for i in range(warmup + iterations):
        for name in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
            x, y = batches[i % 4]
            start = time.perf_counter()
            train_step(ddp[name], optimizers[name], losses[name], x, y)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    dist.barrier()  # the group is left up: the rank ends with os._exit (`serve_rank`; `leave_group` says why)
    return times


def ab_times(model: str, iterations: int) -> dict[str, list[float]]:
    from thrifty.runtime.worlds import World

    world = World(2, f"{Path(__file__).stem}:ab_rank", [model, str(iterations)], where="the A/B world")
    return world.run(stall_timeout_s=600)[0]


def section_reweighting(iterations: int) -> list[tuple[str, str, str]]:
    rows = []
    for model in ("tiny-transformer", "small-cnn", "mlp"):
        times = ab_times(model, iterations)
        median = {name: statistics.median(values) for name, values in times.items()}
        for name, label, target in (("batch", "loss scaling (default)", "<= 5%"), ("hook", "DDP comm hook", "-")):
            rows.append((f"reweighting, {label}, vs plain DDP: {model}, 2 workers x 32",
                         f"{1 / median[name]:.1f} vs {1 / median['plain']:.1f} it/s: "
                         f"{(median[name] / median['plain'] - 1) * 100:+.1f}% time (medians of {len(times['plain'])}, "
                         "interleaved)", target))
    return rows


# -- 5. the job contract's paths against a hand-written DDP loop -------------------------

# each against plain DDP, interleaved with it; the loop function scaling its own loss only with unequal batches
# (with equal ones it is the loop function: DDP's own average is the weighting, and no hook is installed)
PATHS = ("loop function", "loop function, scale_loss", "Trainer")
BLOCK = 20  # iterations of a path, then as many of plain DDP, and so on
# A run's iterations (else 200) and runs (else 6). Each run builds its own models and DDP buckets, and identical
# instances of one model in one world differ in speed for as long as they live (12 identical plain-DDP tiny-mlp
# instances in one world, interleaved: standard deviation 2.1% and 3.8% of the mean in two worlds), so the
# ratio's precision comes from many runs rather than long ones: tiny-mlp, whose iteration is all fixed cost,
# gets the most.
RUN_ITERATIONS = {"tiny-mlp": 500}
RUNS = {"tiny-mlp": 24}


def paths_rank(argv: list[str]) -> None:
    """One rank of the paths world (a worker world's rank)."""
    from thrifty.runtime.worlds import serve_rank

    model, iterations, runs = argv[0], int(argv[1]), int(argv[2])
    batches, first = [int(b) for b in argv[3].split(",")], int(argv[4])
    serve_rank(lambda channel: channel.finish(paths_worker(channel, model, iterations, runs, batches, first)))


def _made(model: str) -> "object":
    """The Trainer of a zoo model, or of ``tiny-mlp`` (8 -> 16 -> 4, float32: almost no compute, so its
    iteration is the runtime's and DDP's fixed cost)."""
    from thrifty.runtime.training.examples import tiny_mlp, zoo

    return tiny_mlp(dtype="float32", samples=4096) if model == "tiny-mlp" else zoo(model=model)


def bench_loop(ctx, model: str = "mlp", scale_loss: bool = False) -> None:
    """A loop function as a user writes one: the zoo model, its optimizer,
    its data, the loss reported every iteration with the state as checkpoint;
    with `scale_loss`, the loop weighs its batch-mean loss by its batch share
    itself (``ctx.loss_scale``) instead of the communication hook."""
    made = _made(model)
    net = made.model()
    optimizer = made.optimizer(net.parameters())
    net = ctx.prepare_model(net, scale_loss=scale_loss)
    scale = ctx.loss_scale if scale_loss else None
    state = {"model": net, "optimizer": optimizer}
    for inputs, targets in ctx.prepare_loader(made.dataset()):
        optimizer.zero_grad()
        loss = made.loss(net(inputs), targets)
        (loss * scale if scale is not None else loss).backward()
        optimizer.step()
        ctx.report({"loss": loss.item()}, checkpoint=state)


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


class PlainDDP:
    """The same training by hand: the same batches of the same data, the
    loss read every iteration (as a loop that logs it does), run a block of
    iterations at a time; DDP's own averaging, and with unequal batches each
    rank's loss weighted by its batch share first, as a correct hand-written
    loop must (Srifty 4.5; `thrifty.runtime.ddp.reweight.loss_scale`)."""

    def __init__(self, made: "object", batches: list[int], rank: int):
        from torch.nn.parallel import DistributedDataParallel

        from thrifty.runtime.ddp.reweight import loss_scale
        from thrifty.runtime.ddp.sharding import ShardedStream, rank_offsets

        self.made, self.net = made, DistributedDataParallel(made.model())
        self.optimizer = made.optimizer(self.net.parameters())
        self.data = made.dataset()
        self.stream = ShardedStream(len(self.data), sum(batches), rank_offsets(batches)[rank], batches[rank], 0)
        self.step, self.losses = 0, []
        self.scale = loss_scale(batches[rank], sum(batches), len(batches)) if len(set(batches)) > 1 else None

    def run(self, iterations: int) -> tuple[float, float]:
        """`iterations` iterations; their wall and CPU time (the process's, every thread)."""
        import torch

        made, net, optimizer, data, stream = self.made, self.net, self.optimizer, self.data, self.stream
        started = _clocks()
        for _ in range(iterations):
            index = torch.from_numpy(stream.indices(self.step))
            inputs, targets = data.tensors[0][index], data.tensors[1][index]
            optimizer.zero_grad()
            loss = made.loss(net(inputs), targets)
            (loss * self.scale if self.scale is not None else loss).backward()
            optimizer.step()
            self.losses.append(loss.item())
            self.step += 1
        ended = _clocks()
        return ended[0] - started[0], ended[1] - started[1]


def _interleaved(ctx: "object", plain: PlainDDP, times: dict[str, list[tuple[float, float]]]) -> None:
    """Run `plain` between the job's blocks: every `BLOCK` batches of the
    job's loader (as its code draws them, so the job's own loop runs as
    written), a block of plain DDP. `times` gets the wall and CPU time of
    each block of each: a job's block from the arrival of its first batch
    at the job's code to the arrival of the next block's first (its
    iterations, reports and draws), after a first block of each left out
    (its first iterations build DDP's buckets)."""
    prepare = ctx.prepare_loader

    class Interleaved:
        def __init__(self, loader):
            self.loader = loader

        def __len__(self):
            return len(self.loader)

        def __iter__(self):
            started = None
            for k, batch in enumerate(self.loader):
                if k % BLOCK == 0:
                    now = _clocks()
                    if started is not None and k > BLOCK:  # the job's first block is its warm-up
                        times["job"].append((now[0] - started[0], now[1] - started[1]))
                    spent = plain.run(BLOCK)
                    if k > 0:  # plain DDP's first block is its warm-up
                        times["plain"].append(spent)
                    started = _clocks()
                yield batch

    ctx.prepare_loader = lambda data, **options: Interleaved(prepare(data, **options))


def paths_worker(channel: "object", model: str, iterations: int, runs: int,
                 batches: list[int], first: int = 0) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Each job path, run as a job would run it, interleaved in blocks with
    plain DDP on the same process group (`_interleaved`): both meet the
    host's load, the other processes' turns and Python's collections
    alike, block after block. Per path, the wall and CPU time of each
    block of the path and of plain DDP. CPU time is what the work costs
    whatever the host's load; wall time adds its waits (the flags'
    all-reduce, the slower rank) and the host's load."""
    import tempfile

    import torch
    import torch.distributed as dist

    from thrifty.runtime.ddp.context import JobContext, metric_sinks
    from thrifty.runtime.ddp.job import JobSpec
    from thrifty.runtime.ddp.loop import trainer_loop
    from thrifty.runtime.worlds import join_world

    torch.set_num_threads(1)
    device = join_world(channel, "gloo", 300.0)
    paths = _paths(batches)
    # per path: the blocks of each side, and where each run's blocks end ("ends": job, plain)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {name: {"job": [], "plain": [], "ends": []}
                                                              for name in paths}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(first, first + runs):
            for name in paths[r % len(paths):] + paths[:r % len(paths)]:
                # one more iteration: the job's last report writes a checkpoint, after the last block
                job = JobSpec(trainer=f"{Path(__file__).stem}:bench_loop", trainer_args={"model": model},
                              global_batch=sum(batches), iterations=iterations + 1, batches=tuple(batches),
                              checkpoint_path=str(Path(folder) / "c.pt"), checkpoint_every=None,
                              restore="never", backend="gloo")
                ctx = JobContext(job, channel, device, False, sum(batches), batches, (),
                                 metric_sinks(job, channel) if channel.rank == 0 else [],
                                 check_finite=name.startswith("loop function"))
                _interleaved(ctx, PlainDDP(_made(model), batches, channel.rank), out[name])
                if name.startswith("loop function"):
                    bench_loop(ctx, model, scale_loss=name.endswith("scale_loss"))
                else:
                    trainer_loop(ctx, _made(model))
                out[name]["ends"].append((len(out[name]["job"]), len(out[name]["plain"])))
                dist.barrier()
    dist.barrier()  # the group is left up: the rank ends with os._exit (`serve_rank`; `leave_group` says why)
    return out


def _paths(batches: list[int]) -> tuple[str, ...]:
    return PATHS if len(set(batches)) > 1 else tuple(name for name in PATHS if not name.endswith("scale_loss"))


def _run_ratios(world: dict[str, list[tuple[float, float]]], ends: list[tuple[int, int]]) -> list[float]:
    """Each run's wall time of the path over plain DDP's, in percent more:
    its blocks' mean over the mean of the plain blocks interleaved with them."""
    ratios, job_from, plain_from = [], 0, 0
    for job_to, plain_to in ends:
        job = [t[0] for t in world["job"][job_from:job_to]]
        plain = [t[0] for t in world["plain"][plain_from:plain_to]]
        if job and plain:
            ratios.append((statistics.fmean(job) / statistics.fmean(plain) - 1) * 100)
        job_from, plain_from = job_to, plain_to
    return ratios


def _interval(values: list[float]) -> tuple[float, float, float]:
    """The mean of `values` and its 95% confidence interval (Student's t):
    the runs are independent draws of a pair of model instances, whose
    speeds differ by a few percent for as long as they live."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def section_paths(iterations: int | None, runs: int | None, only: list[str] | None = None,
                  worlds: int = 3) -> list[tuple[str, str, str]]:
    from thrifty.runtime.worlds import World

    rows = []
    # equal batches (DDP's own average is the reweighting), and unequal ones (the loop path's comm hook at work,
    # or the loop's own loss scaling; plain DDP scales its loss, as a correct hand-written loop must)
    for model, batches in (("tiny-mlp", "32,32"), ("tiny-mlp", "24,40"), ("small-cnn", "32,32"),
                           ("tiny-transformer", "32,32"), ("mlp", "32,32"), ("mlp", "24,40"), ("small-cnn", "24,40")):
        if only and model not in only:
            continue
        its = iterations or RUN_ITERATIONS.get(model, 200)
        model_runs = runs or RUNS.get(model, 6)
        model_worlds = max(1, min(worlds, model_runs))  # a world runs one run of each path at least
        # the runs in several worlds, each of fresh processes: a world's ratio of one path to another moves with
        # how its processes met this host's cores
        paths = _paths([int(b) for b in batches.split(",")])
        blocks: dict[str, dict[str, list[tuple[float, float]]]] = {n: {"job": [], "plain": []} for n in paths}
        per_world: dict[str, list[float]] = {name: [] for name in paths}
        per_run: dict[str, list[float]] = {name: [] for name in paths}
        done = 0
        for w in range(model_worlds):
            share = (model_runs - done) // (model_worlds - w)
            world = World(2, f"{Path(__file__).stem}:paths_rank",
                          [model, str(its), str(share), batches, str(done)], where="the paths world")
            per_rank = world.run(stall_timeout_s=600)
            done += share
            for name in paths:
                # a block is as slow as its slower rank in wall time; its CPU time is the ranks' mean
                world = {side: [(max(t[0] for t in ts), statistics.fmean(t[1] for t in ts))
                                for ts in zip(*(r[name][side] for r in per_rank))] for side in ("job", "plain")}
                for side, got in world.items():
                    blocks[name][side] += got
                walls = [statistics.fmean(t[0] for t in world[side]) for side in ("job", "plain")]
                per_world[name].append((walls[0] / walls[1] - 1) * 100)
                per_run[name] += _run_ratios(world, per_rank[0][name]["ends"])
        for name in paths:
            # the target is the loop function's (the default, the hook weighing unequal batches); a loop
            # that scales its own loss and the Trainer are shown beside it
            target = "<= 3%" if name == "loop function" else "-"
            figures = []
            for k, label in ((0, "wall"), (1, "CPU")):
                job = statistics.fmean(t[k] for t in blocks[name]["job"]) / BLOCK
                plain = statistics.fmean(t[k] for t in blocks[name]["plain"]) / BLOCK
                figures.append(f"{label} {job * 1e3:.3f} vs {plain * 1e3:.3f} ms/it ({(job / plain - 1) * 100:+.1f}%)")
            spread = per_world[name]
            mean, low, high = _interval(per_run[name])
            figures.append(f"runs' wall ratios {mean:+.1f}% (95% CI {low:+.1f}..{high:+.1f}%)")
            rows.append((f"{name} path vs plain DDP: {model}, batches {batches}",
                         "; ".join(figures) + f"; wall by world {min(spread):+.1f}..{max(spread):+.1f}% (means of "
                         f"{len(blocks[name]['job'])} and {len(blocks[name]['plain'])} blocks of {BLOCK} iterations, "
                         f"interleaved, in {model_runs} runs of {its} iterations in {model_worlds} worlds)", target))
    return rows


# -- 4. Srifty 5.4 in miniature -----------------------------------------------------------

def profile_now(folder: str) -> str:
    """The tiny transformer's compute profile measured now, on this host, as
    loaded as it is (the shipped one was measured on an idle machine)."""
    from thrifty.runtime.measure.profiler import profile_workload
    from thrifty.runtime.measure.zoo import tiny_transformer
    from thrifty.perfmodels.profile import save_profile

    profile = profile_workload(tiny_transformer(), model_name="tiny-transformer", batches=[8, 16, 32, 64],
                               repeats=12, warmup=2, rounds=3, threads=1, device="cpu", progress=False,
                               command="benchmarks/runtime_overheads.py --profile-now")
    path = str(Path(folder) / "tiny-transformer__cpu.json")
    save_profile(profile, path)
    return path


def section_miniature(plot: Path | None, kill_at: int, fresh_profile: bool) -> list[tuple[str, str, str]]:
    problem = load_problem(DEMO)
    keep = tempfile.TemporaryDirectory()
    if fresh_profile:
        problem = problem.model_copy(update={"model": profile_now(keep.name)})
        console.print("miniature: planned with a compute profile measured just now on this host")
    plan = solve(problem)
    config = RunConfig(checkpoint_every=25, checkpoint_every_s=None, window_s=5.0, window_bins=10, poll_s=0.02)
    failure = None
    with tempfile.TemporaryDirectory() as folder:
        try:
            train(plan, ZOO, problem=problem, run_dir=folder, config=config,
                  faults=[KillWorker(1, at_iteration=kill_at)])
        except ReplanInfeasible as e:  # reported below: the run log tells what happened
            failure = e
        events = read_run_log(Path(folder) / "run.jsonl")
    console.print(f"\n[bold]Srifty 5.4 in miniature[/bold]: {problem.name}")
    console.print(format_timeline(timeline(events)), markup=False, highlight=False)
    if plot is not None:
        plot_run(events, plot, title="Srifty 5.4 in miniature: one spot machine lost without notice")
        console.print(f"plot: {plot}")
    keep.cleanup()
    return miniature_rows(events, problem, plan, failure)


def miniature_rows(events: list[dict], problem, plan, failure: Exception | None) -> list[tuple[str, str, str]]:
    """The miniature's figures, from its run log (complete or not)."""
    ends = [e for e in events if e["event"] == "segment_end"]
    replans = [e for e in events if e["event"] == "replan"]
    finish = next((e for e in events if e["event"] == "finish"), None)
    saves = [e["save_s"] for e in events if e["event"] == "checkpoint"]
    configs = [plan.config] + [e["new_config"] for e in replans]
    rows = [("miniature: plans", " -> ".join(configs), "re-planned after the loss")]
    rows += [("miniature: re-plan latency in the run", f"{e['latency_s'] * 1e3:.0f} ms ({e['reason']})", "<= 1 s")
             for e in replans]
    done = ends[-1]["committed_iteration"] if ends else 0
    rows.append(("miniature: iterations done / lost to the preemption",
                 f"{done} / {sum(e['lost_iterations'] for e in ends)}", f"{problem.iterations} / < 25"))
    if finish is not None:
        rows += [
            ("miniature: elapsed (plan predicted)", f"{finish['elapsed_s']:.1f} s ({plan.predicted.total_s:.1f} s)",
             f"<= {problem.limits.time_s:g} s"),
            ("miniature: cost (plan predicted)", f"${finish['cost_usd']:.4f} (${plan.predicted.cost_usd:.4f})",
             f"<= ${problem.limits.cost_usd:g}"),
            ("miniature: within limits", "yes" if finish["within_limits"] else "NO", "yes"),
        ]
    else:
        rows.append(("miniature: within limits", f"NO: {failure}", "yes"))
    if saves:
        rows.append(("checkpoint save in the run, tiny-transformer (median)",
                     f"{statistics.median(saves) * 1e3:.1f} ms over {len(saves)} saves", "-"))
    launches = [e["launch_s"] for e in ends if e["launch_s"] is not None]
    rows.append(("launch to first iteration in the run (first world, relaunches)",
                 " / ".join(f"{x:.2f} s" for x in launches), "-"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="A/B repeats and re-plan repeats")
    parser.add_argument("--iterations", type=int, default=200, help="A/B iterations per model")
    parser.add_argument("--kill-at", type=int, default=210, help="miniature: iteration of the preemption")
    parser.add_argument("--plot", type=Path, default=Path("out/runtime-srifty54.png"))
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--only-paths", action="store_true",
                        help="only section 5: the loop-function and Trainer paths against plain DDP")
    parser.add_argument("--rounds", type=int, default=None,
                        help="section 5: runs of each path per model (default 24 for tiny-mlp, else 6)")
    parser.add_argument("--path-iterations", type=int, default=None,
                        help="section 5: iterations of a run (default 500 for tiny-mlp, else 200)")
    parser.add_argument("--worlds", type=int, default=3, help="section 5: the runs shared over this many worlds")
    parser.add_argument("--models", nargs="+", default=None, help="section 5: only these models (e.g. tiny-mlp)")
    parser.add_argument("--profile-now", action="store_true",
                        help="miniature: plan with a profile measured now instead of the shipped one (a busy host)")
    args = parser.parse_args()
    console.print(f"host: {load_average()}")
    rows = []
    if not args.only_paths:
        rows += section_replan(max(args.repeats, 3))
        rows += section_checkpoints(args.repeats)
        rows += section_miniature(args.plot, args.kill_at, args.profile_now)
        if not args.skip_throughput:
            rows += section_reweighting(args.iterations)
    rows += section_paths(args.path_iterations, args.rounds, args.models, args.worlds)
    table = Table(title="training runtime overheads (this host)")
    for column in ("figure", "measured", "target"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"host after the runs: {load_average()}")


if __name__ == "__main__":
    main()
