"""World executor: tuning trials as worker worlds of real torch training processes,
started through a launcher (this host's fork server, or the agents of Ray nodes).

Implements the loop's executor interface (`thrifty.runtime.tuning.loop`) with
one *world* of worker processes per launched trial: ``atoms`` ranks of
synchronous data-parallel training (DDP, gloo on 127.0.0.1), with the DDP kit
the training runtime uses (`thrifty.runtime.ddp`: trainer factories, atomic
checkpoints, batch-weighted gradients, sharded data stream, one rank loop), its ranks
a worker world (`thrifty.runtime.worlds`: forked by the fork
server, dying with their parent, reporting in the worlds' one protocol). What HyperSched (4.3) and
HyperDrive (4.2) ask of a trial runtime maps onto it as follows:

- *launch* (start or resume): start ``atoms`` processes; every rank
  restores the trial's checkpoint when it has one (model, optimizer, data
  position; a loop function's own state through ``ctx.restore()``); every
  rank trains one iteration and rank 0 reports the metric;
- *iteration*: ``steps_per_iteration`` optimizer steps on the global batch
  (one epoch of the trainer's dataset, or of the data a loop function gives
  ``ctx.prepare_loader``, by default), then the metric: a `TunableTrainer`'s
  (validation accuracy, higher is better, evaluated by rank 0), or the one a
  loop function reports under the experiment's metric name (combined over
  the ranks, negated for ``mode="min"``); rank 0 reports it and the world
  waits for the loop's decision;
- *proceed*: the next iteration; *suspend* (pause, or the first half of a
  resize): rank 0 writes an atomic checkpoint (unless the iteration's is
  written already) and the world exits; *terminate*: the world exits without
  one (or is killed);
- *durable iterations*: every `checkpoint_every` iterations (default 1:
  each) the ranks checkpoint the iteration *before* rank 0 posts its result,
  and the report carries the checkpoint's reference (`Report.checkpoint`),
  so every result the loop hears, and records, has its checkpoint: a driver
  killed at any moment loses no iteration a record holds. The checkpoint
  holds the result too (`checkpointed_result`): a driver killed after the
  checkpoint was written and before it heard the result finds it there when
  resumed. With ``checkpoint_every`` > 1 (cheaper on big models), a
  resumed trial goes back to its last checkpoint and redoes the iterations
  after it (the resume says so);
- *resize*: suspend, then launch with another number of ranks. The global
  batch is the trainer's `batch_size` (a loop function's: its
  configuration's ``batch_size``, else its parameter's default) whatever the ranks (split by
  `sharding.split_batch`, gradients batch-weighted by `reweight`), so a
  resized trial trains the same model on the same data, only faster or slower
  (strong scaling); the data position is the step count, so any world resumes
  any checkpoint.

Overheads are measured, not assumed: the first report after a launch carries
in ``overhead_s`` the wall time from the launch to the start of its first
iteration (processes, process group, restore) plus the time the worker took
to write the checkpoint it restored (0 for a fresh trial), which is what a
pause/resume or a resize cost the trial (HyperSched's T_o). `launches`
records each launch's parts.

Every wait has a timeout: a world that does not start within
`start_timeout_s`, an iteration that does not report within
`iteration_timeout_s`, a checkpoint not written within `save_timeout_s`, and
workers waiting on a decision for longer than `decision_timeout_s` (they exit
by themselves). A worker that raises or dies is a `Crash` (the loop marks the
trial failed and goes on); every process is reaped when its world ends and in
`close()`.

*Where the ranks run.* With no provider, on this host (the fork server).
With a `provider` (a `thrifty.runtime.cluster.provider.RayProvider`, each
machine a Ray node; provision its machines first for `run_experiment`,
`execute_plan` provisions each stage's itself), on its live machines:
`MachineSlots` gives each machine as many slots as its instance type has
devices (GPUs; one per CPU pseudo machine) or `slots_per_machine`, places a
launch's ranks where the caller says (``where``: machine id -> ranks, what
the plan executor's placement controller chose) or else on the machines
with the most free slots (so that trials spread over the machines), and the
world is started by ``provider.world_launcher`` (an agent per machine forks
the ranks; rank 0's machine hosts the store). Start-up times compare this
host's clock with the workers'.

*Where checkpoints live.* Each trial's checkpoint is
``STORAGE/trial-N/checkpoint.pt`` (`trial_checkpoint`), where `storage` is
a local folder (default: `workdir`) or ``s3://bucket/prefix``
(`thrifty.runtime.ddp.storage`: atomic writes on both). Rank 0 writes it
wherever it runs, and every rank of the trial's next launch reads it
wherever that runs: with S3 storage a trial paused on one machine resumes
on another with no file system shared between them (each machine reaches
S3 with its own AWS configuration: an instance profile, or the AWS
environment of its Ray node). A local `storage` serves machines that share
this host's file system. Worker logs go to ``WORKDIR/trial-N/rankR.log`` on
the machine that runs the rank.

*Machines taken away.* With a provider, the executor reads its
interruption feed (`Provider.interruptions`) while it waits for events: a
machine with a spot notice or lost takes no new rank; the trials with
ranks on it crash (a `Crash`: the loop marks them failed and its scheduler
places what comes next on the atoms left) when it is lost, or when the
notice's deadline passes with them still there (a plan executor above
pauses them before: `thrifty.runtime.tuning.executors.plan`).

The ranks run the one rank loop (`thrifty.runtime.ddp.loop`) that training
jobs run, on a `JobSpec` that leaves the batch and the iteration to the
trainer, evaluates after every iteration and awaits the loop's decision. A
resumed trial restores every rank's random state when it has as many ranks as
when it was saved, and after a resize seeds each rank from ``(seed, step,
rank)`` (`thrifty.runtime.ddp.checkpoint.rank_seed`). Deviation, stated: a
`TunableTrainer`'s metric is computed by rank 0 alone, on the whole
validation set.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.providers.interruptions import Notice
from thrifty.runtime.worlds import World, WorldFailed
from thrifty.runtime.worlds.watch import Failed, Finished, Killed, Lost, ServerGone, Stalled, Watch
from thrifty.runtime.ddp import storage as ddp_storage
from thrifty.runtime.ddp.job import DECISION as COMMAND
from thrifty.runtime.ddp.job import TRIAL_METRIC, JobSpec
from thrifty.runtime.ddp.trainer import TunableTrainer, trainer_spec
from thrifty.runtime.ddp.storage import Location
from thrifty.runtime.ddp.worker import ENTRY, PRELOAD, job_argv
from thrifty.runtime.tuning.clock import Clock, RealClock
from thrifty.runtime.tuning.trial import Crash, Report, Trial

if TYPE_CHECKING:
    from thrifty.runtime.providers.base import Provider

__all__ = ["TunableTrainer", "WorldExecutor", "LaunchRecord", "MachineSlots", "accuracy", "example_trainer",
           "example_loop", "teacher_data",
           "trial_checkpoint", "checkpointed_result"]

log = logging.getLogger(__name__)
# the fork server imports these before forking a trial's ranks: the one worker entry, and this module (its
# example trainer)
RANK_PRELOAD = (*PRELOAD, "thrifty.runtime.tuning.executors.worlds")
POLL_S = 0.01        # how often worlds are looked at while no result is due
FAST_POLL_S = 0.0005  # and once one is: a result is taken within half a millisecond
DUE_FRACTION = 0.8    # a result is due after this fraction of the last iteration's time


def accuracy(model: Any, inputs: Any, targets: Any) -> float:
    """Top-1 accuracy of a classifier on one batch of validation data."""
    return float((model(inputs).argmax(dim=1) == targets).float().mean())


def example_trainer(lr: float = 0.1, hidden: int = 16, momentum: float = 0.0, features: int = 8, classes: int = 4,
                    samples: int = 512, batch_size: int = 32, label_noise: float = 0.1,
                    steps_per_iteration: int | None = None, seed: int = 0) -> TunableTrainer:
    """``Linear(features, hidden) -> Tanh -> Linear(hidden, classes)`` on Gaussian
    points labelled by a fixed random linear teacher (a fraction `label_noise`
    relabelled at random), `samples` for training and as many for validation;
    the metric is validation accuracy. Its hyperparameters (lr, hidden,
    momentum, batch size) change the learning curve, which is what a tuning
    test needs. ``thrifty.runtime.tuning.executors.worlds:example_trainer``."""

    def data(split: int) -> tuple[Any, Any]:
        return teacher_data(features, classes, samples, label_noise, seed, split)

    def model() -> Any:
        import torch
        from torch import nn

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, classes))

    def optimizer(parameters: Any) -> Any:
        import torch

        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)

    def dataset() -> Any:
        from torch.utils.data import TensorDataset

        return TensorDataset(*data(0))

    def loss(outputs: Any, targets: Any) -> Any:
        import torch.nn.functional as F

        return F.cross_entropy(outputs, targets)

    validation = data(1)
    return TunableTrainer(model=model, optimizer=optimizer, dataset=dataset, loss=loss,
                          metric=lambda m: accuracy(m, *validation), batch_size=batch_size,
                          steps_per_iteration=steps_per_iteration)


def teacher_data(features: int, classes: int, samples: int, label_noise: float, seed: int,
                 split: int) -> tuple[Any, Any]:
    """The example's `samples` Gaussian points and their teacher labels: `split`
    0 trains, 1 validates (the same teacher, other points)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(features, classes, generator=generator)
    generator.manual_seed(seed + 1 + split)
    inputs = torch.randn(samples, features, generator=generator)
    targets = (inputs @ teacher).argmax(dim=1)
    noisy = torch.rand(samples, generator=generator) < label_noise
    targets[noisy] = torch.randint(0, classes, (int(noisy.sum()),), generator=generator)
    return inputs, targets


def example_loop(ctx: Any, lr: float = 0.1, hidden: int = 16, momentum: float = 0.0, features: int = 8,
                 classes: int = 4, samples: int = 512, batch_size: int = 32, label_noise: float = 0.1,
                 lr_decay: float = 0.99, seed: int = 0) -> None:
    """`example_trainer` written as a loop function (the job contract of
    `thrifty.runtime.ddp.context`), as a tuning trial runs it: the trial's
    configuration comes as keyword arguments (the global batch is
    `batch_size`, `ctx.global_batch`), a trial iteration is one epoch of the
    training data, the learning rate decays by `lr_decay` a batch (a
    schedule), and each report carries the training ``loss`` and, as a
    callable the runtime calls only at an iteration's end, the validation
    ``accuracy`` and ``val_loss`` (tune either: ``"metric": "accuracy"``,
    ``"mode": "max"`` or ``"metric": "val_loss"``, ``"mode": "min"``). The
    model, optimizer and schedule are checkpointed, so a paused or resized
    trial goes on where it was. ``thrifty.runtime.tuning.executors.worlds:example_loop``."""
    import torch
    import torch.nn.functional as F

    made = example_trainer(lr=lr, hidden=hidden, momentum=momentum, features=features, classes=classes,
                           samples=samples, batch_size=batch_size, label_noise=label_noise, seed=seed)
    model = made.model()
    state = ctx.restore()  # None on a fresh start
    if state is not None:
        model.load_state_dict(state["model"])
    ddp = ctx.prepare_model(model)
    optimizer = made.optimizer(ddp.parameters())
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, lr_decay)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
    val_inputs, val_targets = (t.to(ctx.device) for t in teacher_data(features, classes, samples, label_noise,
                                                                       seed, 1))

    def validation() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            outputs = model(val_inputs)
        model.train()
        return {"accuracy": float((outputs.argmax(dim=1) == val_targets).float().mean()),
                "val_loss": float(F.cross_entropy(outputs, val_targets))}

    for inputs, targets in ctx.prepare_loader(made.dataset()):
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        schedule.step()
        ctx.report(lambda loss=loss: {"loss": loss.item(), **validation()},
                   checkpoint={"model": model, "optimizer": optimizer, "schedule": schedule})


# --- the executor side ------------------------------------------------------------------------

def trial_checkpoint(storage: Location, trial_id: int) -> str:
    """Where a trial's checkpoint is under the executor's `storage` (a
    folder, or ``s3://bucket/prefix``): a path or an ``s3://`` URL."""
    return ddp_storage.join(storage, f"trial-{trial_id}", "checkpoint.pt")


def checkpointed_result(storage: Location, trial_id: int, after: int) -> dict[str, Any] | None:
    """The result of iteration ``after + 1`` of the trial, when its checkpoint
    holds it: the driver was killed after the iteration was checkpointed and
    before the result was heard (the ranks write a due checkpoint, with the
    result, before posting the result). None when the checkpoint is not one
    iteration ahead (or there is none, or it cannot be read). Reads the
    checkpoint with torch (only a resume of a killed run calls this)."""
    from thrifty.core.errors import ThriftyError
    from thrifty.runtime.ddp.checkpoint import load_checkpoint

    path = trial_checkpoint(storage, trial_id)
    try:
        state = load_checkpoint(path)
    except ThriftyError:  # unreadable, or the storage failed: the result is trained again
        return None
    if state is None or int(state.get("iteration", -1)) != after + 1 or not isinstance(state.get("result"), dict):
        return None
    result = state["result"]
    return {"iteration": after + 1, "metric": float(result["metric"]), "iteration_s": float(result["iteration_s"]),
            "checkpoint": {"path": path, "iteration": after + 1}}


@dataclass
class LaunchRecord:
    """One launch of a trial: its ranks, the iteration it resumed from, and
    what it cost before its first iteration started (seconds)."""

    trial_id: int
    atoms: int
    from_iteration: int
    startup_s: float | None = None   # launch -> first iteration started (processes, group, restore)
    restore_s: float | None = None   # the restore alone (rank 0)
    save_s: float = 0.0              # writing the checkpoint it restored
    ended: str | None = None         # suspended | terminated | crashed
    pids: list[int] = field(default_factory=list)
    machines: list[str] = field(default_factory=list)  # rank r's machine (with a provider)

    @property
    def overhead_s(self) -> float | None:
        return None if self.startup_s is None else self.startup_s + self.save_s


class MachineSlots:
    """Which of `provider`'s live machines each rank of a launch runs on.

    A machine has `slots_per_machine` slots, or as many as its instance
    type's devices in `provider.catalog` (at least 1). `take` returns the
    machine of each rank and holds those slots until `free`; `ProviderError`
    when the machines cannot hold the launch."""

    def __init__(self, provider: Provider, slots_per_machine: int | None = None):
        if slots_per_machine is not None and (not isinstance(slots_per_machine, int) or slots_per_machine < 1):
            raise ProblemError(f"`slots_per_machine` is {slots_per_machine!r}, but must be a positive integer",
                               path="slots_per_machine")
        self.provider, self.slots_per_machine = provider, slots_per_machine
        self._held: dict[int, list[str]] = {}
        self.gone: set[str] = set()  # machines taken away (a notice, a loss): no new rank goes there

    def capacity(self) -> dict[str, int]:
        """Free slots of each live machine, in the provider's order."""
        used: dict[str, int] = {}
        for machines in self._held.values():
            for m in machines:
                used[m] = used.get(m, 0) + 1
        return {m.id: self._slots(m.instance_type) - used.get(m.id, 0) for m in self.provider.machines()
                if m.id not in self.gone}

    def _slots(self, instance_type: str) -> int:
        if self.slots_per_machine is not None:
            return self.slots_per_machine
        catalog = self.provider.catalog
        return max(1, catalog.get(instance_type).gpus) if catalog is not None else 1

    def take(self, trial_id: int, atoms: int, where: Mapping[str, int] | None = None) -> list[str]:
        free = self.capacity()
        if where is not None:
            over = {m: n for m, n in where.items() if n > free.get(m, 0)}
            if over or sum(where.values()) != atoms:
                raise ProviderError(f"trial {trial_id}: cannot place {atoms} ranks as {dict(where)} on the free "
                                    f"slots {free}")
            ranks = [m for m, n in where.items() for _ in range(n)]
        else:
            if sum(free.values()) < atoms:
                raise ProviderError(f"trial {trial_id} needs {atoms} slots; the {len(free)} machines have "
                                    f"{sum(free.values())} free")
            ranks = []
            for _ in range(atoms):  # each rank on the machine with the most free slots: trials spread out
                m = max(free, key=lambda k: free[k])
                free[m] -= 1
                ranks.append(m)
            ranks.sort(key=list(free).index)  # a machine's ranks together, rank 0 on the first
        self._held[trial_id] = ranks
        return ranks

    def free(self, trial_id: int) -> None:
        self._held.pop(trial_id, None)


@dataclass
class _World:
    trial_id: int
    world: World
    record: LaunchRecord
    launched_at: float             # unix time
    waiting_since: float           # monotonic: since the launch or the last "go"
    iteration: int                 # last iteration reported
    watch: Watch                   # the world's watcher (`on_event` is `note`)
    reported: bool = False
    idle: bool = False             # reported and waiting for the loop's decision
    saved: dict[str, Any] | None = None
    pending: deque = field(default_factory=deque)
    expected_s: float | None = None  # the last iteration's time: when the next result is due

    @property
    def error(self) -> str | None:
        """The first error a rank reported, or None."""
        first = next(iter(self.watch.errors.values()), None)
        return None if first is None else f"rank {first['rank']}: {first['message']}"

    def note(self, event: dict[str, Any]) -> None:
        """Keep a rank's result (for the loop) and checkpoint reports."""
        if event["event"] == "result":
            self.pending.append(event)
        elif event["event"] == "checkpoint":
            self.saved = event

    def saved_now(self) -> bool:
        """Is the checkpoint of the iteration last reported written?"""
        return self.saved is not None and int(self.saved["iteration"]) == self.iteration

    def due_in(self, now: float) -> float | None:
        """Seconds (monotonic) until the next result may arrive: a little before
        the last iteration's time has passed since "go"; None if not known."""
        if self.idle or not self.reported or self.expected_s is None:
            return None
        return self.waiting_since + DUE_FRACTION * self.expected_s - now


class WorldExecutor:
    """Trials as worker processes on this host (see the module docstring).

    `trainer` is ``MODULE:FUNCTION`` (or a module-level function): a loop
    function (the job contract of `thrifty.runtime.ddp.context`), called in
    every rank as ``train(ctx, **config)`` with a trial's configuration, or a
    factory returning a `TunableTrainer` when called with it. A loop's trial
    reports `metric` by that name (``ctx.report({metric: value})``), which
    the scheduler reads as a score by `mode` (``min``: negated); its global
    batch is the configuration's ``batch_size``, else the default of the
    loop's ``batch_size`` parameter (`thrifty.runtime.ddp.trainer.loop_batch_size`).
    A trial's iteration is `steps_per_iteration` batches (None: the
    TunableTrainer's, else one epoch of the data given to
    ``ctx.prepare_loader``). `workdir` holds each trial's worker logs, and
    `storage` (default: `workdir`; a folder or ``s3://bucket/prefix``) each
    trial's checkpoint: a loop's ``checkpoint=`` state, which ``ctx.restore()``
    gives back when the trial resumes, on any machine and number of ranks.
    Use it as a context manager, or call `close()`: it kills and reaps
    whatever still runs.
    """

    def __init__(self, trainer: str | Callable[..., Any], workdir: str | Path, *, clock: Clock | None = None,
                 seed: int = 0, threads: int = 1, start_timeout_s: float = 120.0,
                 iteration_timeout_s: float = 600.0, save_timeout_s: float = 120.0,
                 decision_timeout_s: float = 600.0, stop_grace_s: float = 5.0, provider: Provider | None = None,
                 slots_per_machine: int | None = None, checkpoint_every: int | None = 1,
                 storage: Location | None = None, metric: str = TRIAL_METRIC, mode: str = "max",
                 steps_per_iteration: int | None = None):
        if not isinstance(threads, int) or threads < 1:
            raise ProblemError(f"`threads` is {threads!r}, but must be a positive integer", path="threads")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or checkpoint_every < 1):
            raise ProblemError(f"`checkpoint_every` is {checkpoint_every!r}, but must be a positive integer "
                               "(or None: only when paused)", path="checkpoint_every")
        if mode not in ("max", "min"):
            raise ProblemError(f"`mode` is {mode!r}, but must be 'max' or 'min'", path="mode")
        if not isinstance(metric, str) or not metric:
            raise ProblemError(f"`metric` is {metric!r}, but must be the name a loop reports", path="metric")
        if steps_per_iteration is not None and (not isinstance(steps_per_iteration, int) or steps_per_iteration < 1):
            raise ProblemError(f"`steps_per_iteration` is {steps_per_iteration!r}, but must be a positive integer "
                               "(or None: one epoch)", path="steps_per_iteration")
        for name, value in (("start_timeout_s", start_timeout_s), ("iteration_timeout_s", iteration_timeout_s),
                            ("save_timeout_s", save_timeout_s), ("decision_timeout_s", decision_timeout_s),
                            ("stop_grace_s", stop_grace_s)):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ProblemError(f"`{name}` is {value!r}, but must be a positive number of seconds", path=name)
        self.trainer = trainer_spec(trainer)
        self.workdir = Path(workdir)
        try:
            ddp_storage.parse_folder(storage if storage is not None else self.workdir)
        except ProblemError as e:
            raise ProblemError(e.message, path="storage") from None
        self.storage: Location = storage if storage is not None else self.workdir
        self.clock = clock if clock is not None else RealClock()
        self.seed, self.threads = seed, threads
        self.start_timeout_s, self.iteration_timeout_s = start_timeout_s, iteration_timeout_s
        self.save_timeout_s, self.decision_timeout_s = save_timeout_s, decision_timeout_s
        self.stop_grace_s = stop_grace_s
        self.checkpoint_every = checkpoint_every
        self.metric, self.mode, self.steps_per_iteration = metric, mode, steps_per_iteration
        self.provider = provider
        self.slots = MachineSlots(provider, slots_per_machine) if provider is not None else None
        self._interruptions = provider.interruptions.reader() if provider is not None else None
        self._leaving: dict[str, tuple[float, str]] = {}  # machine -> (when it goes, Unix seconds; why)
        self._interruptions_read = 0.0  # monotonic
        self.launches: list[LaunchRecord] = []
        self._worlds: dict[int, _World] = {}
        self._ready: deque[Report | Crash] = deque()

    def checkpoint_of(self, trial_id: int) -> str:
        """Where trial `trial_id`'s checkpoint is (a path or an ``s3://`` URL)."""
        return trial_checkpoint(self.storage, trial_id)

    # --- the executor interface ---------------------------------------------------------------
    def launch(self, trial: Trial, atoms: int, where: Mapping[str, int] | None = None) -> None:
        """Start (or resume) `trial` on `atoms` ranks; with a provider, on the
        machines `where` says (machine id -> ranks), else where most slots are free."""
        checkpoint = trial.checkpoint
        record = LaunchRecord(trial.trial_id, atoms, 0 if checkpoint is None else int(checkpoint["iteration"]),
                              save_s=0.0 if checkpoint is None else float(checkpoint.get("save_s", 0.0)))
        self.launches.append(record)
        folder = self.workdir / f"trial-{trial.trial_id}"  # its worker logs (and a local storage's checkpoint)
        folder.mkdir(parents=True, exist_ok=True)
        if not ddp_storage.is_remote_folder(self.storage):
            Path(self.checkpoint_of(trial.trial_id)).parent.mkdir(parents=True, exist_ok=True)
        if checkpoint is not None and checkpoint.get("error"):
            record.ended = "crashed"
            self._ready.append(Crash(trial.trial_id, f"cannot resume: {checkpoint['error']}", self.clock.now()))
            return
        job = JobSpec(trainer=self.trainer, trainer_args=dict(trial.config),
                      checkpoint_path=self.checkpoint_of(trial.trial_id),
                      restore="required" if checkpoint is not None else "never",
                      steps_per_iteration=self.steps_per_iteration, metric=self.metric, mode=self.mode,
                      checkpoint_every=self.checkpoint_every, evaluate=True, await_decision=True, metrics_every_s=None,
                      weighting="hook", backend="gloo", seed=self.seed, threads=self.threads,
                      timeout_s=self.decision_timeout_s)
        launcher = None
        if self.slots is not None:
            assert self.provider is not None  # slots come with a provider
            try:
                record.machines = self.slots.take(trial.trial_id, atoms, where)
            except ProviderError as e:
                record.ended = "crashed"
                self._ready.append(Crash(trial.trial_id, str(e), self.clock.now()))
                return
            launcher = self.provider.world_launcher(record.machines, RANK_PRELOAD)
        world = World(atoms, ENTRY, job_argv(job), logs=lambda rank: folder / f"rank{rank}.log",
                      threads=self.threads, timeout_s=self.decision_timeout_s,
                      preload=RANK_PRELOAD, launcher=launcher,
                      where=f"trial {trial.trial_id}")
        # the stall clock: the start, until the first result; then each iteration, from the loop's "go"
        watch = Watch(world, settle_timeout_s=self.decision_timeout_s, stall_timeout_s=self.start_timeout_s)
        entry = _World(trial.trial_id, world, record, time.time(), time.monotonic(), record.from_iteration, watch)
        watch.on_event = entry.note
        self._worlds[trial.trial_id] = entry
        try:
            world.start()
        except WorldFailed as e:
            self._crash(entry, str(e))
            return
        record.pids.extend(world.pids)

    def proceed(self, trial: Trial) -> None:
        world = self._worlds[trial.trial_id]
        world.world.command(COMMAND.format(world.iteration), "go")
        world.idle = False
        world.waiting_since = time.monotonic()
        world.watch.sign()
        world.watch.stall_timeout_s = self.iteration_timeout_s

    def suspend(self, trial: Trial) -> dict[str, Any]:
        """Checkpoint and stop; the reference carries an `error` (and the trial
        fails at its next launch) if the checkpoint could not be written. A
        trial that does not run (one a resumed run settles from its last
        result) is where its last checkpoint is: `trial.checkpoint`."""
        world = self._worlds.pop(trial.trial_id, None)
        if world is None:
            return trial.checkpoint
        reference: dict[str, Any] = {"path": self.checkpoint_of(trial.trial_id),
                                     "iteration": world.iteration}
        if world.error is None and world.world.procs:
            world.world.command(COMMAND.format(world.iteration), "save")
            limit = time.monotonic() + self.save_timeout_s
            while not world.saved_now() and world.error is None and time.monotonic() < limit:
                look = world.watch.look()
                if not world.saved_now() and all(c is not None for c in look.codes):
                    world.watch.look()  # a checkpoint report may have landed just before the exits
                    break
                time.sleep(POLL_S)
        if world.saved_now():
            assert world.saved is not None
            reference.update(save_s=float(world.saved["save_s"]), bytes=int(world.saved["bytes"]))
        else:
            reference["error"] = world.error or f"no checkpoint written within {self.save_timeout_s:g} s"
        world.record.ended = "suspended"
        self._end(world, graceful=world.saved_now())
        return reference

    def terminate(self, trial: Trial) -> None:
        world = self._worlds.pop(trial.trial_id, None)
        self._ready = deque(e for e in self._ready if e.trial_id != trial.trial_id)
        if world is None:
            return
        world.record.ended = world.record.ended or "terminated"
        if world.idle:  # waiting for a decision: let it exit cleanly
            world.world.command(COMMAND.format(world.iteration), "stop")
        self._end(world, graceful=world.idle)

    def next_event(self, until: float | None) -> Report | Crash | None:
        while True:
            if self._ready:
                # an event that came after `until` is not yet one (the experiment's deadline: a result read after
                # it is not the experiment's, as the simulator never gives one due after it); it waits its turn
                if until is not None and self._ready[0].at > until:
                    return None
                return self._ready.popleft()
            if not self._worlds:
                return None
            self._interrupted()
            for world in list(self._worlds.values()):
                self._check(world)
            if self._ready:
                continue
            now = self.clock.now()
            if until is not None and now >= until:
                return None
            wait = self._poll_interval()
            self.clock.sleep_until(now + wait if until is None else min(until, now + wait))

    def _poll_interval(self) -> float:
        """`FAST_POLL_S` while some running trial's result is due, else until
        the first one is due (at most `POLL_S`): short iterations are not
        held up by the poll, and idle waits cost little."""
        now = time.monotonic()
        wait = POLL_S
        for world in self._worlds.values():
            due = world.due_in(now)
            if due is not None:
                wait = min(wait, max(due, FAST_POLL_S))
        return wait

    def close(self) -> None:
        """Stop every world (no checkpoints) and reap its processes."""
        for world in list(self._worlds.values()):
            world.record.ended = world.record.ended or "terminated"
            self._end(world, graceful=False)
        self._worlds.clear()
        self._ready.clear()

    def __enter__(self) -> "WorldExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- watching worlds ----------------------------------------------------------------------
    def _interrupted(self) -> None:
        """Machines taken away (the provider's interruption feed, read at most
        every `POLL_S`): no new rank goes there; the trials on a machine lost,
        or whose notice ran out, crash."""
        now = time.monotonic()
        if self._interruptions is None or self.slots is None or now - self._interruptions_read < POLL_S:
            return
        self._interruptions_read = now
        for event in self._interruptions.poll():
            machine = event.machine_id
            if machine is None or machine in self.slots.gone:
                continue
            self.slots.gone.add(machine)
            self._leaving[machine] = (event.deadline if isinstance(event, Notice) else event.at,
                                      event.preemption.reason or event.preemption.source)
        for machine, (deadline, why) in list(self._leaving.items()):
            if time.time() < deadline:
                continue
            del self._leaving[machine]
            for world in [w for w in self._worlds.values() if machine in w.record.machines]:
                self._crash(world, f"trial {world.trial_id}: machine {machine} was taken away ({why})")

    def _check(self, world: _World) -> None:
        """Turn what a world did since the last look into events."""
        look = world.watch.look()
        if world.pending:
            while world.pending:
                event = world.pending.popleft()
                if not world.reported and int(event["iteration"]) != world.record.from_iteration + 1:
                    self._crash(world, f"trial {world.trial_id} restored a checkpoint at iteration "
                                       f"{int(event['iteration']) - 1}, not at its last recorded iteration "
                                       f"{world.record.from_iteration}")
                    return
                self._ready.append(self._report(world, event))
            return
        tid = world.trial_id
        match look.outcome:
            case None:
                return
            case Lost(ranks=[(rank, code), *_]) if world.error is None:
                self._crash(world, f"rank {rank} of trial {tid} exited with code {code} without a report "
                                   f"(log: {self.workdir / f'trial-{tid}' / f'rank{rank}.log'})")
            case Finished():
                self._crash(world, f"the workers of trial {tid} exited without being asked to")
            case Stalled() if world.reported:
                self._crash(world, f"trial {tid} reported no result within {self.iteration_timeout_s:g} s")
            case Stalled():
                self._crash(world, f"trial {tid} did not start within {self.start_timeout_s:g} s")
            case Failed() | Lost():
                self._crash(world, world.error or "")
            case ServerGone():
                self._crash(world, f"the worker fork server exited while trial {tid} ran")
            case Killed():  # the executor ends its worlds by closing them, never through the watch
                self._crash(world, f"the workers of trial {tid} were killed")

    def _report(self, world: _World, event: dict[str, Any]) -> Report:
        overhead = 0.0
        if not world.reported:
            world.record.startup_s = max(0.0, float(event["started_at"]) - world.launched_at)
            world.record.restore_s = float(event["restore_s"])
            overhead = world.record.startup_s + world.record.save_s
        world.reported = True
        world.iteration = int(event["iteration"])
        world.expected_s = float(event["iteration_s"])
        world.idle = True
        world.watch.stall_timeout_s = None  # the world awaits the loop's decision (its ranks time out by themselves)
        checkpoint = None
        if event.get("checkpointed"):  # written before the result was posted: its checkpoint event came first
            checkpoint = {"path": self.checkpoint_of(world.trial_id), "iteration": world.iteration}
            if world.saved_now():
                assert world.saved is not None
                checkpoint.update(save_s=float(world.saved["save_s"]), bytes=int(world.saved["bytes"]))
        return Report(world.trial_id, world.iteration, float(event["metric"]), float(event["iteration_s"]),
                      world.world.size, self.clock.now(), overhead, checkpoint)

    def _crash(self, world: _World, message: str) -> None:
        world.record.ended = "crashed"
        self._worlds.pop(world.trial_id, None)
        self._ready.append(Crash(world.trial_id, message, self.clock.now()))
        self._end(world, graceful=False)

    def _end(self, world: _World, graceful: bool = True) -> None:
        """Let the processes exit (when they were told to) or kill them; reap them; free their slots."""
        try:
            world.world.close(grace_s=self.stop_grace_s if graceful else 0.0)
        finally:
            if self.slots is not None:
                self.slots.free(world.trial_id)
