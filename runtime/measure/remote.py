"""Measuring on a cluster's machines: what runs there, as ranks of worker
worlds (`thrifty.runtime.worlds.World`) whose launcher puts them on the
machines (``thrifty profile --cluster``, ``thrifty profile-scaling
--cluster``).

- `wait_ready`: a world of one rank per machine whose ranks only say they
  run: the moment the last one does is when the machines are ready for
  work (the INIT end of a launch-to-ready time), and their fork servers are
  warm for the measurement that follows;
- `profile_on`: the compute profile (`thrifty.runtime.measure.profiler`, or
  `thrifty.runtime.measure.job_profile` for a job, its settings holding
  ``job_args``) measured in a rank on one machine, exactly as ``thrifty
  profile`` measures it on this host (the same function, with its settings),
  its DDP-overhead and co-located workers being processes of that machine.
"""

from __future__ import annotations

import json
import time
from typing import Any

from thrifty.runtime.measure.probe import ProbeFailed
from thrifty.runtime.worlds import Launcher, RankChannel, World, serve_rank

__all__ = ["REMOTE_PRELOAD", "wait_ready", "profile_on"]

_THIS = "thrifty.runtime.measure.remote"
REMOTE_PRELOAD = (_THIS, "thrifty.runtime.measure.profiler", "thrifty.runtime.measure.scaling_profiler",
                  "thrifty.runtime.measure.job_profile")


def wait_ready(launcher: Launcher, machines: int, timeout_s: float) -> float:
    """Start one rank on each of `machines` machines (rank r on the
    launcher's r-th) and wait until every one runs; the monotonic time of
    that. Raises `ProbeFailed` when a rank fails or none reports within
    `timeout_s`."""
    world = World(machines, f"{_THIS}:_ready_rank", launcher=launcher, timeout_s=timeout_s, preload=(_THIS,),
                  where=f"a worker on each of {machines} machine{'s' if machines > 1 else ''}")
    world.run(stall_timeout_s=timeout_s, failure=ProbeFailed)
    return time.monotonic()


def _ready_rank(argv: list[str]) -> None:
    serve_rank(lambda channel: channel.finish(time.time()))


def profile_on(launcher: Launcher, settings: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The compute profile document that `profile_workload(**settings)`
    (plus ``factory``, a ``module:function`` spec, whose workload the rank
    loads) measures in a rank on the launcher's machine. Raises `ProbeFailed`
    when the rank fails or goes `timeout_s` without reporting."""
    world = World(1, f"{_THIS}:_profile_rank", [json.dumps(settings)], launcher=launcher, timeout_s=timeout_s,
                  threads=int(settings.get("threads", 1)), preload=REMOTE_PRELOAD,
                  where=f"the compute profile of '{settings['factory']}'")
    [document] = world.run(stall_timeout_s=timeout_s, failure=ProbeFailed)
    return document


def _profile_rank(argv: list[str]) -> None:
    serve_rank(lambda channel: _profile(channel, json.loads(argv[0])))


def _profile(channel: RankChannel, settings: dict[str, Any]) -> None:
    from thrifty.perfmodels.profile import profile_document
    from thrifty.runtime.measure.profiler import load_workload, profile_workload

    channel.progress(1)
    if "job_args" in settings:  # a job: its own loop, timed as on this host
        from thrifty.runtime.measure.job_profile import profile_job, resolve_target

        target = resolve_target(settings.pop("factory"), settings.pop("job_args"))
        profile = profile_job(target, **settings)
    else:
        profile = profile_workload(load_workload(settings["factory"]), progress=False, **settings)
    channel.finish(profile_document(profile))
