"""``thrifty profile JOB``: measure a compute profile (Srifty 4.1) on this
machine and write it atomically.

JOB (``package.module:function``, or ``path/to/train.py:function``, a file
imported by its path; or a training problem file that names its ``job``, whose
``job_args`` and listed ``batch_sizes`` it takes) is resolved once
(`thrifty.runtime.measure.job_profile.resolve_target`): a job (a loop
function ``train(ctx, **args)``, or a factory of the four-factory
`Trainer`), whose own loop is timed (`profile_job`), or a `Workload`
factory (``(model, make_batch, loss_fn)``, `profile_workload`). ``--job-args
JSON`` are its keyword arguments. A job's profile goes to the job profile
cache (`thrifty.perfmodels.job_profiles`), keyed by the job's code and
arguments, for ``--instance-type TYPE`` (the catalog's type this machine is)
or else for this machine's device, where ``thrifty solve`` finds it for a
problem that names the job; ``--out`` also writes it to a file (a workload's
profile needs ``--out``).

The provenance of the written file records this command with every setting
spelled out, so re-running that line reproduces the measurement.

``--cluster CLUSTER --instance-types A,B,C [--market spot]`` measures the
same profile on one machine of each type taken from the cluster (on a GPU
type, on its GPU: the largest batch that fits, forward, backward,
gradient-ready times, DDP's overhead; the device key is the catalog's), gives
each machine back, writes the profiles into one bundle
(`thrifty.perfmodels.bundle`, which a problem's ``model`` can name) and
prints what the profiling cost (`thrifty.runtime.commands._on_cluster`).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from thrifty.core.errors import ProblemError

from thrifty.runtime.commands._args import int_at_least, output_file, positive_float, with_exit_codes
from thrifty.runtime.commands._on_cluster import add_cluster_arguments, check_cluster_arguments

HELP = "measure a model's compute profile (forward/backward latency per batch, gradient-ready times) here"

__all__ = ["HELP", "add_arguments", "run", "parse_batches", "command_line"]


def parse_batches(text: str) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]``; anything else is a `ProblemError`."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        batches = [int(part) for part in parts]
    except ValueError:
        raise ProblemError(f"--batches is '{text}', but must be positive integers separated by commas") from None
    if any(b < 1 for b in batches) or len(set(batches)) < 2:
        raise ProblemError(f"--batches is '{text}', but must be two or more distinct positive integers")
    return sorted(set(batches))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "the profile was written",
                             1: "a worker or measurement failed, or the cluster gave no machine"})
    parser.add_argument("factory", metavar="JOB",
                        help="a job (a loop function train(ctx, ...), or a Trainer factory) or a Workload factory, "
                             "as package.module:function or path/to/train.py:function, e.g. "
                             "thrifty.runtime.measure.zoo:mlp; or a training problem file naming its job "
                             "(\"job\": its job_args and listed batch_sizes are used)")
    parser.add_argument("--job-args", metavar="JSON", help="the job's (or factory's) keyword arguments, a JSON object")
    parser.add_argument("--instance-type", metavar="TYPE",
                        help="a job: the catalog's instance type this machine is (its profile prices that type; "
                             "default: every type of this machine's device)")
    parser.add_argument("--out", type=output_file, metavar="PROFILE.json",
                        help="where to write the profile (a job's also goes to the job profile cache)")
    parser.add_argument("--name", help="the model name in the profile (default: the factory's name, '_' as '-')")
    sweep = parser.add_mutually_exclusive_group()
    sweep.add_argument("--batches", metavar="1,2,4,...", help="the batch sizes to time")
    sweep.add_argument(
        "--max-batch", type=int_at_least(1), metavar="N",
        help="time 1, 2, 4, ... up to N (default 256 on CPU; on CUDA the largest batch that fits, up to 4096)",
    )
    parser.add_argument("--repeats", type=int_at_least(1), default=10, help="timed iterations per batch (default 10)")
    parser.add_argument(
        "--warmup", type=int_at_least(0), default=3,
        help="untimed iterations before each batch's timed ones (default 3)"
    )
    parser.add_argument(
        "--rounds", type=int_at_least(1), default=3,
        help="passes over the batches that share the repeats, so noise spreads over all batches (default 3)",
    )
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads (default 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to run (default auto)")
    parser.add_argument("--device-name", metavar="NAME",
                        help="the profile's device key (default: cpu, or the GPU model)")
    parser.add_argument(
        "--ready-batch", type=int_at_least(1), metavar="N",
        help="the batch of the gradient-ready trace (default: the swept batch nearest 32)",
    )
    parser.add_argument(
        "--memory-gb", type=positive_float, metavar="GB",
        help="CPU only: cap max_batch at the batch whose estimated training memory fits in GB GiB",
    )
    parser.add_argument(
        "--colocated", type=int_at_least(1), default=1, metavar="K",
        help="CPU only: also measure the sweep in K processes at once, as K workers sharing this host's cores "
             "see it (the simulator uses it for K or more local workers; default 1: not measured)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    add_cluster_arguments(parser, "the profile")
    parser.add_argument("--timeout", type=positive_float, default=1800.0, metavar="S",
                        help="with --cluster: stop a machine's measurement that reports nothing for S seconds, "
                             "and wait at most S for a machine to be ready (default 1800)")


def default_name(factory: str) -> str:
    return factory.rsplit(":", 1)[-1].rsplit(".", 1)[-1].replace("_", "-")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this measurement: the factory and every
    setting that affects the data, defaults included (not --no-progress)."""
    words = ["thrifty", "profile", args.factory]
    for flag, value in (("--job-args", args.job_args), ("--instance-type", args.instance_type), ("--out", args.out)):
        if value is not None:
            words += [flag, value]
    words += ["--name", args.name or default_name(args.factory)]
    if args.batches is not None:
        words += ["--batches", ",".join(str(b) for b in parse_batches(args.batches))]
    if args.max_batch is not None:
        words += ["--max-batch", str(args.max_batch)]
    words += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--rounds", str(args.rounds)]
    words += ["--threads", str(args.threads)]
    if args.cluster is None:
        words += ["--device", args.device]
    if args.colocated > 1:
        words += ["--colocated", str(args.colocated)]
    for flag, value in (
        ("--device-name", args.device_name),
        ("--ready-batch", args.ready_batch),
        ("--memory-gb", args.memory_gb),
        ("--cluster", args.cluster),
        ("--instance-types", args.instance_types),
        ("--market", args.market or ("on_demand" if args.cluster else None)),
        ("--catalog", args.catalog),
    ):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    from thrifty.perfmodels.profile import save_profile
    from thrifty.runtime.measure import profile_workload, resolve_target

    check_cluster_arguments(args)
    _job_of_problem(args)
    batches = parse_batches(args.batches) if args.batches is not None else None
    name = args.name or default_name(args.factory)
    job_args = parse_job_args(args.job_args)
    if args.cluster is not None and args.instance_type is not None:
        raise ProblemError("--instance-type names this machine's type; with --cluster give --instance-types")
    target = resolve_target(args.factory, job_args)  # a bad job or factory fails here, before any machine is taken
    if args.cluster is not None:
        if job_args and not target.is_job:
            raise ProblemError("--job-args with --cluster: the cluster's machines load a Workload factory without "
                               "arguments")
        return _run_on_cluster(args, batches, name, target)
    if target.is_job:
        return _run_job(args, target, batches, name)
    if args.out is None:
        raise ProblemError(f"'{args.factory}' is a Workload factory: give --out PROFILE.json (only a job's profile "
                           "goes to the job profile cache)")
    if args.instance_type is not None:
        raise ProblemError("--instance-type keys a job's profile in the cache; a Workload factory's goes to --out")
    profile = profile_workload(
        target.workload,
        model_name=name,
        batches=batches,
        max_batch=args.max_batch,
        repeats=args.repeats,
        warmup=args.warmup,
        rounds=args.rounds,
        threads=args.threads,
        device=args.device,
        ready_batch=args.ready_batch,
        memory_limit_bytes=int(args.memory_gb * 2**30) if args.memory_gb is not None else None,
        device_name=args.device_name,
        command=command_line(args),
        progress=not args.no_progress,
        colocated=args.colocated,
        factory=args.factory if not job_args else None,  # processes load the factory without arguments
    )
    save_profile(profile, args.out)
    _print_summary(profile, args.out)
    return 0


def _job_of_problem(args: argparse.Namespace) -> None:
    """JOB as every process names it: a file's path made absolute; a training
    problem file (``.json``, ``.yaml``) in its place stands for the job it
    names (``"job"``), with its ``job_args`` and, unless ``--batches`` or
    ``--max-batch`` is given, its listed ``batch_sizes``: the profile that
    ``thrifty solve`` on that problem looks for."""
    import json
    from pathlib import Path

    from thrifty.core.optional import absolute_spec, file_spec

    given = args.factory
    if file_spec(given) is None and given.lower().endswith((".json", ".yaml", ".yml")) and Path(given).is_file():
        from thrifty.solver.problem import TrainingProblem, load_problem

        problem = load_problem(given)
        job = problem.job if isinstance(problem, TrainingProblem) else None
        if job is None:
            raise ProblemError(f"{given} names no job: profile a job (MODULE:FUNCTION or path/to/train.py:FUNCTION), "
                               "or give the problem one (\"job\")")
        if args.job_args is not None:
            raise ProblemError(f"{given} gives the job's arguments (job_args); leave --job-args out")
        assert isinstance(problem, TrainingProblem)
        args.factory = job
        args.job_args = json.dumps(problem.job_args, sort_keys=True) if problem.job_args else None
        listed = problem.batch_sizes
        if args.batches is None and args.max_batch is None and isinstance(listed, list) and len(set(listed)) > 1:
            args.batches = ",".join(str(b) for b in sorted(set(listed)))
    else:
        args.factory = absolute_spec(given)


def parse_job_args(text: str | None) -> dict[str, Any]:
    """``--job-args``: a JSON object, else a one-line error."""
    import json

    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ProblemError(f"--job-args is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ProblemError(f"--job-args is a JSON {type(value).__name__}, but must be an object of keyword arguments")
    return value


def _check_job_options(args: argparse.Namespace) -> None:
    colocated = args.colocated if args.colocated > 1 else None
    for flag, value in (("--memory-gb", args.memory_gb), ("--colocated", colocated)):
        if value is not None:
            raise ProblemError(f"{flag} applies to a Workload factory; a job is timed as its loop runs")


def _job_batches(args: argparse.Namespace, batches: list[int] | None) -> list[int]:
    """A job's sweep: --batches, else 1, 2, 4, ... up to --max-batch (default 256)."""
    from thrifty.runtime.measure import DEFAULT_CPU_MAX_BATCH, geometric_batches

    return batches if batches is not None else geometric_batches(args.max_batch or DEFAULT_CPU_MAX_BATCH)


def _run_job(args: argparse.Namespace, target: Any, batches: list[int] | None, name: str) -> int:
    """Time the job's own loop; its profile into the job profile cache (and --out)."""
    from thrifty.perfmodels.job_profiles import store_profile
    from thrifty.perfmodels.profile import profile_document, save_profile
    from thrifty.runtime.measure import profile_job

    _check_job_options(args)
    device_name = args.device_name
    if args.instance_type is not None:
        from thrifty.datasets.catalog import load_catalog

        device_name = device_name or load_catalog(args.catalog).get(args.instance_type).device
    profile = profile_job(target, model_name=name, batches=_job_batches(args, batches), repeats=args.repeats,
                          warmup=args.warmup, rounds=args.rounds, threads=args.threads, device=args.device,
                          device_name=device_name, command=command_line(args), ready_batch=args.ready_batch)
    document = profile_document(profile)
    key = profile.extra["job"]["key"]
    if args.instance_type is not None:
        cached = store_profile(document, key, instance_type=args.instance_type)
    else:
        cached = store_profile(document, key, device=profile.device)
    if args.out is not None:
        save_profile(profile, args.out)
    _print_summary(profile, args.out or str(cached))
    if args.out is not None:
        print(f"cached {cached}")
    return 0


def _run_on_cluster(args: argparse.Namespace, batches: list[int] | None, name: str, target: Any) -> int:
    """One machine of each type: the profile measured there, the machine given back; one bundle (--out), the
    cost. A job's profiles also go to the job profile cache, each for its type."""
    from thrifty.datasets.catalog import load_catalog
    from thrifty.perfmodels.profile import parse_profile
    from thrifty.perfmodels.job_profiles import store_profile
    from thrifty.runtime.commands._on_cluster import (measure_types, parse_instance_types, print_costs,
                                                      say_on_stderr, write_bundle)
    from thrifty.runtime.measure import REMOTE_PRELOAD, profile_on

    if args.device != "auto" or args.device_name is not None:
        raise ProblemError("--device and --device-name come from each type's catalog entry with --cluster; "
                           "leave them out")
    catalog = load_catalog(args.catalog)
    types = parse_instance_types(args.instance_types, catalog)
    market = args.market or "on_demand"
    if target.is_job:
        _check_job_options(args)
    elif args.out is None:
        raise ProblemError(f"'{args.factory}' is a Workload factory: give --out BUNDLE.json")
    command = command_line(args)

    def measure(itype: Any, provider: Any, machines: list[Any]) -> dict[str, Any]:
        if target.is_job:
            settings = {"factory": args.factory, "job_args": dict(target.args), "model_name": name,
                        "batches": _job_batches(args, batches), "repeats": args.repeats, "warmup": args.warmup,
                        "rounds": args.rounds, "threads": args.threads,
                        "device": "cpu" if itype.device == "cpu" else "cuda", "device_name": itype.device,
                        "ready_batch": args.ready_batch, "command": command}
            launcher = provider.world_launcher([machines[0].id], REMOTE_PRELOAD)
            return profile_on(launcher, settings, args.timeout)
        settings = {"factory": args.factory, "model_name": name, "batches": batches, "max_batch": args.max_batch,
                    "repeats": args.repeats, "warmup": args.warmup, "rounds": args.rounds, "threads": args.threads,
                    "device": "cpu" if itype.device == "cpu" else "cuda", "device_name": itype.device,
                    "ready_batch": args.ready_batch, "colocated": args.colocated, "command": command,
                    "memory_limit_bytes": int(args.memory_gb * 2**30) if args.memory_gb is not None else None}
        launcher = provider.world_launcher([machines[0].id], REMOTE_PRELOAD)
        return profile_on(launcher, settings, args.timeout)

    say = (lambda _line: None) if args.no_progress else say_on_stderr
    profiles, costs = measure_types(args.cluster, catalog, types, market, lambda _t: 1, measure, args.timeout, say)
    if args.out is not None:
        write_bundle(args.out, "compute", name, args.cluster, market, command, profiles, costs)
    for itype, document in profiles.items():
        profile = parse_profile(document)
        _print_summary(profile, args.out or "", where=itype)
        if target.is_job:
            print(f"cached {store_profile(document, profile.extra['job']['key'], instance_type=itype)}")
    print_costs(costs, market, args.out or "the job profile cache")
    return 0


def _print_summary(profile: Any, out: str, where: str | None = None) -> None:
    """The profile's table; `where`: the instance type it was measured on (a bundle's, its file then written
    after every type's table)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{profile.model} on {profile.device}" + (f" ({where})" if where else ""))
    for column in ("batch", "fwd ms", "bwd ms", "fwd sd ms", "bwd sd ms"):
        table.add_column(column, justify="right")
    for p in profile.points:
        table.add_row(
            str(p.batch),
            f"{p.forward_s * 1e3:.3f}",
            f"{p.backward_s * 1e3:.3f}",
            f"{p.forward_sd_s * 1e3:.3f}",
            f"{p.backward_sd_s * 1e3:.3f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"max_batch {profile.max_batch} ({profile.extra.get('max_batch_source', '?')}), "
        f"step {profile.step_s * 1e3:.3f} ms, {len(profile.layers)} gradient tensors, "
        f"{profile.total_grad_bytes / 1e6:.2f} MB of gradients"
    )
    if where is None:
        console.print(f"wrote {out}")
