"""``thrifty validate JOB --config 'local@16+local@48'``: check thrifty's
iteration prediction for a job or a model on this host before renting
anything (issue 18; jobs: issue 35).

JOB (``package.module:function``) is resolved once
(`thrifty.runtime.measure.resolve_target`), as ``thrifty profile`` resolves
it: a job, that is a loop function ``train(ctx, **args)`` or a factory of the
four-factory `Trainer` (``--job-args JSON``: its keyword arguments), or a
`Workload` factory ``(model, make_batch, loss_fn)``.

For each configuration (``--config``, repeatable) it runs real DDP training
here, one worker process per ``local`` rank with that rank's batch (gloo on
CPU; NCCL with one GPU per rank on CUDA), ``--rounds`` interleaved rounds
of ``--warmup`` plus ``--iterations`` iterations, the median of the round
means reported with the p95 of all rounds' iterations (per iteration, the
slowest rank's), and predicts the same configuration with thrifty's
iteration simulator (`thrifty simulate`), then prints both side by side with
the breakdown. What runs:

- a job: the user's own loop, through the rank machinery ``thrifty run``
  uses (`thrifty.runtime.ddp.loop.run_rank`, a `JobContext` with the
  configuration's batches, DDP with the batch-share reweighting), timed from
  the clock marks of online calibration
  (`thrifty.runtime.measure.job_truth`; the untimed iterations are at least
  one more than the clock marks' own warm-up, `first_timed`);
- a Workload: the truth loop of `thrifty.runtime.measure.truth` (the loop
  of ``benchmarks/perfmodel_accuracy.py``: an ordinary user loop, no barrier
  between iterations).

The prediction needs the compute profile on this device: ``--profile FILE``
when given; for a job, its profile in the job profile cache
(`thrifty.perfmodels.job_profiles`, keyed by the job's source and
arguments) measured on this device with the same threads up to the
configurations' largest batch, else the job is profiled here first with
``thrifty profile``'s job profiler (its own loop, in this process) at the
configurations' batches, and the profile cached; for a Workload, a shipped
one when it was measured from this very factory with the same threads (the
zoo's, ``thrifty.runtime.measure.zoo:mlp``...), else this command profiles
the factory first with `thrifty profile`'s profiler, at the configurations'
batches (with co-located workers on CPU, as the simulator prices workers
that share this host's cores).

What is compared: the mean iteration (per iteration, the slowest rank's), its
p95, and per part the slowest rank's part:

- a Workload: the forward pass (with the loss and DDP's buffer broadcast),
  the backward pass, and the optimizer step with ``zero_grad()``. The
  predicted backward pass and exposed communication are not measured apart:
  DDP's ``backward()`` returns when its allreduces are done, so the measured
  backward is compared with their sum. Timing the allreduces on their own
  would take hooks or a barrier inside the loop, and change what it costs.
- a job: its clock marks' parts, split as the job profiler splits an
  iteration: the prepared model's forward passes (the loss is not in them),
  the backward pass with the loss (to the last gradient ready), the exchange
  after it (DDP's allreduce not yet done, with any wait for a slower rank, and
  what the loop does before the step, such as clipping), measured apart and
  compared with the exposed communication, and the rest of the iteration
  (the optimizer step, data loading, ``zero_grad()``, the report), compared
  with the predicted step. The iteration itself is timed from report to
  report: everything the loop does.

On CUDA the compute profile is the GPU's (device key as `thrifty profile`
names it), and NCCL is priced, unless ``--allreduce`` gives a model fitted on
this host's probes (the shipped learned model is of gloo on CPU), by the
allreduce model of the catalog type this host is (`host_instance_type`: a
type of this GPU, one machine holding every rank): the derived cloud model
where it has a basis for that type, else the analytic ring over that
type's interconnect, which the output calls a FALLBACK. Where no catalog
type has this GPU, communication cannot be priced here: a configuration of
one rank (which exchanges nothing) is still validated, and one of several
ranks is an error that says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from typing import Any

from thrifty.core.errors import ProblemError

from thrifty.runtime.commands._args import int_at_least, output_file, with_exit_codes

HELP = ("check thrifty's iteration prediction for a job or a model here: real DDP iterations (a job's own loop) "
        "against the prediction")

__all__ = ["HELP", "add_arguments", "run", "FORMAT", "host_instance_type"]

FORMAT = "thrifty.validation/1"
SPREAD_WARNING = 0.2  # round means further apart than this: the host's speed moved while measuring


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "", 1: "a worker or measurement failed"})
    parser.add_argument("factory", metavar="JOB",
                        help="a job (a loop function train(ctx, ...), or a Trainer factory) or a Workload factory, "
                             "as package.module:function, e.g. thrifty.runtime.training.examples:mlp_loop")
    parser.add_argument("--job-args", metavar="JSON", help="the job's keyword arguments, a JSON object")
    parser.add_argument("--config", required=True, action="append", metavar="CONFIG",
                        help="local ranks and their batches, e.g. 'local@16+local@48' or '2xlocal@32'; "
                             "repeat for several configurations")
    parser.add_argument("--iterations", type=int_at_least(1), default=30,
                        help="timed iterations per round (default 30)")
    parser.add_argument("--warmup", type=int_at_least(0), default=10,
                        help="untimed iterations before them (default 10)")
    parser.add_argument("--rounds", type=int_at_least(1), default=3,
                        help="interleaved runs of every configuration; the median is reported (default 3)")
    parser.add_argument("--profile", metavar="PROFILE.json",
                        help="the model's compute profile (thrifty profile); default: a job's in the job profile "
                             "cache, a factory's shipped one, else the job or factory is profiled here first")
    parser.add_argument("--save-profile", type=output_file, metavar="PROFILE.json",
                        help="where to keep the profile measured here (for --profile next time)")
    parser.add_argument("--allreduce", metavar="MODEL.json",
                        help="a learned allreduce model (thrifty fit-allreduce); default: the shipped local "
                             "gloo model on CPU, on CUDA the model of the catalog type of this host's GPUs")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="cpu (gloo) or cuda (NCCL, one GPU per rank); default auto")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--json", action="store_true", help="print only the results, as JSON")
    parser.add_argument("--out", type=output_file, metavar="RESULTS.json",
                        help="also write the results (JSON) to this file")
    parser.add_argument("--no-progress", action="store_true", help="print nothing while measuring")


@dataclasses.dataclass(frozen=True)
class _Config:
    text: str
    groups: list[Any]  # MachineGroup, as `thrifty simulate` parses them

    @property
    def batches(self) -> tuple[int, ...]:
        """One batch per rank: a ``local`` machine is one worker process."""
        return tuple(g.batch for g in self.groups for _ in range(g.devices))


def run(args: argparse.Namespace) -> int:
    from thrifty.core.io import write_json
    from thrifty.runtime.commands.profile import parse_job_args
    from thrifty.runtime.measure import check_ranks, device_label, resolve_device, resolve_target

    configs = [_parse_config(text) for text in args.config]
    device = resolve_device(args.device)
    for config in configs:
        check_ranks(config.batches, device, what=f"config '{config.text}'")
    # a bad job or factory is a clear error here, not a traceback from every rank
    target = resolve_target(args.factory, parse_job_args(args.job_args))
    if args.job_args is not None and not target.is_job:
        raise ProblemError(f"--job-args: '{args.factory}' is a Workload factory, which the worker processes call "
                           "without arguments")
    device_key = device_label(device)
    model, profile_info = _compute_model(args, device, device_key, configs, target)
    gpus = _cuda_gpus() if device == "cuda" else 0
    predictions, sources, provenance = _predict(model, configs, device_key, args.allreduce, gpus)
    truths = _measure(args, device, configs, target)
    document = _document(args, device, model, profile_info, sources, configs, predictions, truths, target)
    document["allreduce_provenance"] = provenance
    if args.out:
        write_json(args.out, document)
    if args.json:
        import json

        print(json.dumps(document, indent=1))
    else:
        _print_human(document, args.out)
    return 0


# --- inputs -------------------------------------------------------------------------------


def _parse_config(text: str) -> _Config:
    """The configuration as `thrifty simulate` parses it; only ``local``
    machines can run here."""
    from thrifty.datasets.catalog import load_catalog
    from thrifty.perfmodels.cluster import parse_cluster

    try:
        groups = parse_cluster(text, load_catalog())
    except ProblemError as e:
        raise ProblemError(f"config '{text}': {e.message}") from None
    others = sorted({g.instance_type.name for g in groups if g.instance_type.name != "local"})
    if others:
        raise ProblemError(
            f"config '{text}' has {', '.join(repr(o) for o in others)}, but validate runs the configuration "
            "on this host, so every machine must be 'local' (one worker process, e.g. 'local@16+local@48'); "
            "thrifty simulate predicts other machine types")
    return _Config(text, groups)


# --- the prediction -----------------------------------------------------------------------


def _compute_model(args: argparse.Namespace, device: str, device_key: str,
                   configs: list[_Config], target: Any) -> tuple[Any, dict[str, Any]]:
    """The compute model to predict with, and where it came from."""
    from thrifty.perfmodels.compute import load_compute_model

    if args.profile:
        model = load_compute_model(args.profile)
        if model.device != device_key:
            raise ProblemError(f"profile '{args.profile}' is of device '{model.device}', but this run is on "
                               f"'{device_key}'")
        return model, {"source": "file", "path": args.profile}
    if target.is_job:
        return _job_model(args, device, device_key, configs, target)
    shipped = _shipped_model(args.factory, device_key, args.threads)
    if shipped is not None:
        return shipped, {"source": "shipped", "command": shipped.provenance.get("command")}
    return _profile_here(args, device, device_key, configs)


def _shipped_model(factory: str, device_key: str, threads: int) -> Any | None:
    """The shipped compute model measured from `factory` with `threads`
    threads (its provenance says so), or None: a shipped profile of the same
    name from another factory is another model."""
    from thrifty.perfmodels.library import shipped_library
    from thrifty.runtime.measure import default_model_name

    try:
        model = shipped_library().get(default_model_name(factory), device_key)
    except ProblemError:
        return None
    words = shlex.split(model.provenance.get("command") or "")
    measured_threads = words[words.index("--threads") + 1] if "--threads" in words[:-1] else "1"
    return model if words[:3] == ["thrifty", "profile", factory] and measured_threads == str(threads) else None


def _job_model(args: argparse.Namespace, device: str, device_key: str, configs: list[_Config],
               target: Any) -> tuple[Any, dict[str, Any]]:
    """A job's compute model: its profile in the job profile cache
    (`thrifty.perfmodels.job_profiles`) measured on this device with the same
    threads up to the configurations' largest batch, else its loop profiled
    here first with `thrifty profile`'s job profiler at the configurations'
    batches, the profile then cached (and kept at --save-profile)."""
    import json

    from thrifty.perfmodels.compute import ComputeModel
    from thrifty.perfmodels.job_profiles import job_key, profile_path, store_profile
    from thrifty.perfmodels.profile import load_profile, profile_document, save_profile
    from thrifty.runtime.measure import default_model_name, profile_job

    batches = _profile_batches(configs)
    cached = profile_path(job_key(target.spec, target.args), device=device_key)
    if cached.is_file():
        profile = load_profile(cached)
        largest = max(b for config in configs for b in config.batches)
        if profile.extra.get("threads") == args.threads and profile.max_batch >= largest:
            if args.save_profile:
                save_profile(profile, args.save_profile)
            return ComputeModel.from_profile(profile), {"source": "job profile cache", "path": str(cached),
                                                        "command": profile.provenance.command}
    name = default_model_name(args.factory)
    words = ["thrifty", "profile", args.factory]
    if target.args:
        words += ["--job-args", json.dumps(dict(target.args), sort_keys=True)]
    words += ["--name", name, "--batches", ",".join(map(str, batches)), "--threads", str(args.threads),
              "--device", device]
    _say(args, f"no profile of the job '{args.factory}' on {device_key} with {args.threads} thread"
               f"{'s' if args.threads > 1 else ''} up to its batches in the job profile cache: profiling its "
               f"loop here first (batches {', '.join(map(str, batches))}; give --profile PROFILE.json to skip this)")
    profile = profile_job(target, model_name=name, batches=batches, threads=args.threads, device=device,
                          command=shlex.join(words))
    stored = store_profile(profile_document(profile), profile.extra["job"]["key"], device=profile.device)
    _say(args, f"cached the profile at {stored}")
    if args.save_profile:
        save_profile(profile, args.save_profile)
        _say(args, f"wrote the profile to {args.save_profile}")
    return ComputeModel.from_profile(profile), {"source": "measured here", "command": shlex.join(words),
                                                "path": args.save_profile or str(stored)}


def _profile_batches(configs: list[_Config]) -> list[int]:
    """The configurations' batches, sorted, at least two (a profile needs two batch sizes)."""
    batches = sorted({b for config in configs for b in config.batches})
    if len(batches) == 1:
        batches.append(2 * batches[0])
    return batches


def _profile_here(args: argparse.Namespace, device: str, device_key: str,
                  configs: list[_Config]) -> tuple[Any, dict[str, Any]]:
    """Profile the factory here at the configurations' batches (and, on CPU,
    with as many co-located workers as the smallest multi-rank configuration
    has, up to the host's cores)."""
    from thrifty.perfmodels.compute import ComputeModel
    from thrifty.runtime.measure import default_model_name, load_workload, profile_workload
    from thrifty.perfmodels.profile import save_profile

    name = default_model_name(args.factory)
    batches = _profile_batches(configs)
    worlds = [len(config.batches) for config in configs if len(config.batches) > 1]
    colocated = min([*worlds, os.cpu_count() or 1]) if device == "cpu" and worlds else 1
    words = ["thrifty", "profile", args.factory, "--out", args.save_profile or "PROFILE.json", "--name", name,
             "--batches", ",".join(map(str, batches)), "--threads", str(args.threads), "--device", device]
    if colocated > 1:
        words += ["--colocated", str(colocated)]
    _say(args, f"no shipped compute profile of '{args.factory}' on {device_key}: profiling it here first "
               f"(batches {', '.join(map(str, batches))}"
               f"{f', {colocated} co-located workers' if colocated > 1 else ''}; "
               "give --profile PROFILE.json to skip this)")
    profile = profile_workload(load_workload(args.factory), model_name=name, batches=batches,
                               threads=args.threads, device=device, command=shlex.join(words),
                               progress=not (args.no_progress or args.json), colocated=colocated,
                               factory=args.factory)
    if args.save_profile:
        save_profile(profile, args.save_profile)
        _say(args, f"wrote the profile to {args.save_profile}")
    return ComputeModel.from_profile(profile), {"source": "measured here", "command": shlex.join(words),
                                                "path": args.save_profile}


def _cuda_gpus() -> int:
    from thrifty.core.optional import require

    return int(require("torch", "torch").cuda.device_count())


def host_instance_type(catalog: Any, device_key: str, host_gpus: int, world: int) -> Any:
    """The catalog type this host is, to price the allreduce of `world`
    ranks on its GPUs (all on one machine): among the types of device
    `device_key` with at least `world` GPUs, the one with exactly the
    host's GPU count, else the fewest GPUs above it, else the most below
    it (the host may have GPUs no type has in that number); of those, the
    cheapest on demand (the smallest host, when sizes differ in CPUs and
    memory alone), then by name. None when no type has that GPU (or none has
    `world` of them)."""
    fits = [t for t in catalog.types.values() if t.device == device_key and t.gpus >= world]
    if not fits:
        return None

    def rank(t: Any) -> tuple[int, int, float, str]:
        price = t.on_demand_usd_per_hour if t.on_demand_usd_per_hour is not None else float("inf")
        if t.gpus == host_gpus:
            return (0, 0, price, t.name)
        return (1, t.gpus, price, t.name) if t.gpus > host_gpus else (2, -t.gpus, price, t.name)

    return min(fits, key=rank)


def _bandwidth(device_key: str, configs: list[_Config], allreduce: str | None, gpus: int) -> Any:
    """The allreduce model the prediction uses (module docstring)."""
    from thrifty.perfmodels.bandwidth import AnalyticAllreduce, OnOneMachine
    from thrifty.perfmodels.loading import default_bandwidth_model, load_bandwidth_model

    if allreduce:
        return load_bandwidth_model(allreduce)
    if device_key == "cpu":
        return default_bandwidth_model()
    from thrifty.datasets.catalog import load_catalog

    world = max(len(config.batches) for config in configs)
    itype = host_instance_type(load_catalog(), device_key, gpus, world)
    if itype is not None:
        return OnOneMachine(default_bandwidth_model(), itype)
    if world > 1:
        raise ProblemError(f"cannot price communication on this host's {device_key} GPUs: no type of the catalog "
                           f"has {world} or more of them; give --allreduce MODEL.json (thrifty probe-allreduce and "
                           "fit-allreduce on this host), or validate configurations of one rank")
    return AnalyticAllreduce()  # one rank exchanges nothing: never asked


def _predict(model: Any, configs: list[_Config], device_key: str, allreduce: str | None,
             gpus: int = 0) -> tuple[list[Any], dict[str, str], dict[str, Any]]:
    from thrifty.perfmodels.library import ModelLibrary
    from thrifty.perfmodels.simulator import IterationSimulator

    bandwidth = _bandwidth(device_key, configs, allreduce, gpus)
    library = ModelLibrary(paths=[])
    library.add(model)
    simulator = IterationSimulator(model.model, library=library, bandwidth=bandwidth)
    predictions, sources, provenance = [], {}, {}
    for config in configs:
        groups = config.groups
        if device_key != "cpu":  # a local rank on this host's GPU
            groups = [dataclasses.replace(g, instance_type=dataclasses.replace(g.instance_type, device=device_key))
                      for g in groups]
        try:
            prediction = simulator.simulate(groups)
        except ProblemError as e:
            raise ProblemError(f"config '{config.text}': {e.message}") from None
        predictions.append(prediction)
        if prediction.world_size > 1:
            sources.update(prediction.bandwidth_sources)
            provenance.update({g.instance_type.name: bandwidth.provenance_of(g.instance_type).model_dump()
                               for g in groups})
    return predictions, sources, provenance


# --- the measurement ----------------------------------------------------------------------


def _measure(args: argparse.Namespace, device: str, configs: list[_Config], target: Any) -> list[Any]:
    from thrifty.runtime.measure import first_timed, measure_job_rounds, measure_rounds, summarize

    backend = "NCCL" if device == "cuda" else "gloo"
    warmup = first_timed(args.warmup) if target.is_job else args.warmup
    what = "iterations of the job's own loop" if target.is_job else "DDP iterations"
    _say(args, f"measuring {len(configs)} configuration{'s' if len(configs) > 1 else ''} here: "
               f"{args.rounds} round{'s' if args.rounds > 1 else ''} of {warmup} + {args.iterations} "
               f"{what} ({backend})")

    def report(r: int, k: int, run: Any) -> None:
        _say(args, f"  round {r + 1}/{args.rounds}: {configs[k].text}: {run.slowest().mean() * 1e3:.2f} ms")

    if target.is_job:
        runs = measure_job_rounds(target.spec, target.args, [config.batches for config in configs], args.warmup,
                                  args.iterations, args.rounds, device=device, threads=args.threads, on_run=report)
    else:
        runs = measure_rounds([(args.factory, config.batches) for config in configs], args.warmup, args.iterations,
                              args.rounds, device=device, threads=args.threads, on_run=report)
    return [summarize(r) for r in runs]


def _say(args: argparse.Namespace, line: str) -> None:
    if not (args.no_progress or args.json):
        print(line, file=sys.stderr, flush=True)


# --- the results --------------------------------------------------------------------------


def _parts(truth: Any, p: Any) -> list[dict[str, Any]]:
    """The compared figures, measured (None where not measured apart) and
    predicted: a job's run splits the backward pass from the exposed
    communication (`Truth.compute_s`), and its forward is the model's alone
    (the loss is in the backward) and its step the rest of the loop."""
    job = truth.compute_s is not None
    rows = [
        ("iteration mean", truth.mean_s, p.mean_s),
        ("iteration p95", truth.p95_s, p.p95_s),
        ("forward (model)" if job else "forward (with loss)", truth.forward_s, p.forward_s),
        ("backward (with loss)" if job else "backward (compute)", truth.compute_s, p.backward_s),
        ("exposed communication", truth.exchange_s, p.exposed_comm_s),
        ("backward + exposed comm.", truth.backward_s, p.backward_s + p.exposed_comm_s),
        ("step and the rest of the loop" if job else "step (with zero_grad)", truth.step_s, p.step_s),
    ]
    return [{"part": part, "measured_s": m, "predicted_s": q, "error": None if m is None else q / m - 1.0}
            for part, m, q in rows]


def _document(args: argparse.Namespace, device: str, model: Any, profile: dict[str, Any], sources: dict[str, str],
              configs: list[_Config], predictions: list[Any], truths: list[Any], target: Any) -> dict[str, Any]:
    from thrifty.core.validation import json_object
    from thrifty.perfmodels.cluster import format_cluster
    from thrifty.runtime.measure import first_timed

    results = []
    for config, p, truth in zip(configs, predictions, truths):
        results.append({
            "config": format_cluster(config.groups),
            "batches": list(config.batches),
            "world_size": len(config.batches),
            "measured": json_object(truth),
            "predicted": p.to_json(),
            "error": p.mean_s / truth.mean_s - 1.0,
            "parts": _parts(truth, p),
        })
    return {
        "format": FORMAT,
        "factory": args.factory,
        "kind": "job" if target.is_job else "workload",
        "job_args": dict(target.args),
        "model": model.model,
        "device": device,
        "backend": "nccl" if device == "cuda" else "gloo",
        "threads": args.threads,
        "iterations": args.iterations,
        "warmup": first_timed(args.warmup) if target.is_job else args.warmup,
        "rounds": args.rounds,
        "profile": profile,
        "allreduce": sources,
        "configs": results,
    }


def _print_human(document: dict[str, Any], out: str | None) -> None:
    from rich.console import Console

    from thrifty.perfmodels.provenance import FigureSource

    console = Console()
    for result in document["configs"]:
        _print_config(console, document, result)
    profile = document["profile"]
    where = profile.get("path") or profile.get("command") or ""
    console.print(f"compute profile: {profile['source']}{f' ({where})' if where else ''}", markup=False)
    if document["allreduce"]:
        console.print("allreduce model: " + ", ".join(f"{k}: {v}" for k, v in document["allreduce"].items()))
    else:
        console.print("allreduce model: none needed (one rank exchanges nothing)")
    for name, where in document.get("allreduce_provenance", {}).items():
        source = FigureSource.model_validate(where)
        line = f"  {name}: {source.describe()}" + (f" ({source.note})" if source.note else "")
        console.print(line, markup=False, highlight=False, soft_wrap=True, style="bold" if source.fallback else None)
    if out:
        console.print(f"wrote {out}", markup=False)


def _print_config(console: Any, document: dict[str, Any], result: dict[str, Any]) -> None:
    """One configuration's table, its ranks and its rounds."""
    from rich.table import Table

    measured, world = result["measured"], result["world_size"]
    table = Table(title=f"{document['model']} on {result['config']}: {world} rank{'s' if world > 1 else ''}, "
                        f"{document['device']}, {document['backend']}")
    for column in ("", "measured", "predicted", "error"):
        table.add_column(column, justify="right" if column else "left")
    for row in result["parts"]:
        cell = "-" if row["measured_s"] is None else _ms(row["measured_s"])
        error = "" if row["error"] is None else f"{row['error']:+.1%}"
        table.add_row(row["part"], cell, _ms(row["predicted_s"]), error)
    console.print(table)
    ranks = ", ".join(f"{r} (batch {b}) {_ms(s)}"
                      for r, (b, s) in enumerate(zip(result["batches"], measured["rank_mean_s"])))
    console.print(f"per rank, mean iteration: {ranks}")
    rounds = ", ".join(_ms(s) for s in measured["round_means_s"])
    apart = f" ({measured['spread']:.0%} apart; the median is shown)" if len(measured["round_means_s"]) > 1 else ""
    console.print(f"round means ({document['iterations']} iterations each): {rounds}{apart}")
    if measured["spread"] > SPREAD_WARNING:
        console.print(f"[yellow]the rounds are {measured['spread']:.0%} apart: this host's speed moved while "
                      "measuring (other work on it?); more --rounds or a quieter host give a steadier figure")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"
