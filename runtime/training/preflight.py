"""Every check a run makes before it starts work, in one function: `check_run`.

`train` calls it before it writes anything or starts a process, and
``thrifty run --dry-run`` calls it and stops there, so a dry run says yes
exactly when a run would get past its start: the two cannot drift apart. It
does not stop at the first problem; it reports every one it finds, at once
(`RunProblems`, one line each, each naming its file and field where it has
one):

- the problem's catalog loads, and the plan fits the problem (`plans.plan_problems`:
  machines offered, within their quotas, batches adding up to the global batch);
- the machines: the provider (or the cluster ``--cluster`` names) can give
  them (`Provider.check_plan`: the local provider runs CPU types in the
  markets the catalog prices; a Ray cluster's live nodes must carry them; a
  cluster config file must be valid);
- the job (``--trainer``): ``MODULE:FUNCTION`` imports, and is a loop
  function whose parameters take the given arguments, or a factory that
  returns a `Trainer` with them (`thrifty.runtime.ddp.trainer.resolve_job`);
- the checkpoint location: it parses, and holds no checkpoint for a new run,
  one for a resumed run;
- the injected faults (`faults.fault_problems`): they name machines the plan
  has, iterations the run reaches and times within its time limit.

Nothing here starts a process or writes a file; a Ray cluster named by
address is joined to read its nodes (and left again when the check made the
connection), a cluster config file is only read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.core.errors import ProblemError, in_file
from thrifty.runtime.providers.base import Provider
from thrifty.runtime.training.faults import Fault, fault_problems
from thrifty.runtime.training.plans import plan_problems
from thrifty.solver.plan import Plan
from thrifty.solver.problem import TrainingProblem

__all__ = ["RunProblems", "RunInputs", "check_run"]


class RunProblems(ProblemError):
    """Everything wrong with a run's input, found before it started: `problems`,
    one `ProblemError` each; the message is their messages, one a line."""

    def __init__(self, problems: Sequence[ProblemError]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
        if len(self.problems) == 1:  # one problem: its field and file, as when it was raised alone
            only = self.problems[0]
            self.path, self.source, self.message = only.path, only.source, only.message


@dataclass(frozen=True)
class RunInputs:
    """What a run is about to start with (what `train` resolved, or ``thrifty run --dry-run``)."""

    plan: Plan
    problem: TrainingProblem
    trainer: str | Callable[..., Any] | None
    trainer_args: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None  # where the checkpoint will be (None: not known, not checked)
    checkpoint_field: str = "run_dir"  # the option that chose it, for the message
    resuming: bool = False
    faults: Sequence[Fault] = ()
    elapsed_s: float = 0.0  # the run's clock at the start (a resumed run's earlier sessions)
    cluster: str | Path | None = None
    plan_source: str | None = None  # the plan's file, named in its errors


class _Collect:
    def __init__(self) -> None:
        self.problems: list[ProblemError] = []

    @contextmanager
    def check(self, source: str | None = None) -> Iterator[None]:
        try:
            if source is None:
                yield
            else:
                with in_file(source):
                    yield
        except RunProblems as e:
            self.problems += e.problems
        except ProblemError as e:
            self.problems.append(e)


def check_run(run: RunInputs, provider: Provider | None = None) -> Catalog:
    """Check everything `run` needs before it starts; raise `RunProblems`
    listing every problem found, else return the problem's catalog.

    The machines are checked with `provider`; without one, with the provider
    ``run.cluster`` names: the local provider, or a connection to the Ray
    cluster at that address made for the check and closed after it, or the
    cluster config file read (its machines do not exist before the run)."""
    found = _Collect()
    catalog: Catalog | None = None
    with found.check():
        catalog = load_catalog(run.problem.catalog)
    if catalog is not None:
        found.problems += plan_problems(run.plan, run.problem, catalog, source=run.plan_source)
        with found.check():
            _check_machines(run, catalog, provider)
    with found.check():
        _check_trainer(run)
    with found.check():
        _check_checkpoint(run)
    found.problems += fault_problems(run.faults, run.plan, run.problem, run.elapsed_s)
    if found.problems:
        raise RunProblems(found.problems)
    assert catalog is not None  # a catalog that did not load is a problem
    return catalog


def _allocations(plan: Plan) -> list[tuple[str, str, int]]:
    return [(a.instance_type, a.market, a.count) for a in plan.allocation]


def _check_machines(run: RunInputs, catalog: Catalog, provider: Provider | None) -> None:
    if not run.plan.allocation:
        return  # plan_problems said so
    if provider is not None:
        provider.check_plan(_allocations(run.plan))
        return
    from thrifty.runtime.cluster.spec import cluster_kind

    kind = cluster_kind(run.cluster)
    if kind == "config":  # its machines are started by the run: the file must be good
        from thrifty.runtime.providers.config import load_cluster_config

        load_cluster_config(str(run.cluster))
        return
    from thrifty.runtime.cluster.spec import cluster_provider

    made = cluster_provider(run.cluster, "check", catalog)
    try:
        made.check_plan(_allocations(run.plan))
    finally:
        made.close()


def _check_trainer(run: RunInputs) -> None:
    if run.trainer is None:
        raise ProblemError("is required: give --job MODULE:FUNCTION or path/to/train.py:FUNCTION, a loop function "
                           "or a Trainer factory (e.g. thrifty.runtime.training.examples:zoo), or name the job in the "
                           "problem (\"job\")", path="trainer")
    from thrifty.runtime.ddp.trainer import check_loop_arguments, resolve_job, trainer_spec

    code = resolve_job(trainer_spec(run.trainer), run.trainer_args)  # a factory that raises is bad input
    if code.loop is not None:
        check_loop_arguments(code.spec, code.loop, run.trainer_args)


def _check_checkpoint(run: RunInputs) -> None:
    if run.checkpoint is None:
        return
    from thrifty.runtime.ddp import storage

    storage.parse(run.checkpoint)  # a bad location is bad input
    where = run.checkpoint_field
    if storage.exists(run.checkpoint) and not run.resuming:
        raise ProblemError(f"already holds a checkpoint ({storage.describe(run.checkpoint)}); resume it or choose "
                           "another location", path=where)
    if run.resuming and not storage.exists(run.checkpoint):
        raise ProblemError(f"has no checkpoint to resume ({storage.describe(run.checkpoint)})", path=where)
