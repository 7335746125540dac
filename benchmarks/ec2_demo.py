"""The miniature Srifty 5.4 scenario through the ``ec2`` provider (issue 7).

Srifty 5.4: ResNet50, 400 iterations under 500 s at least cost; the plan is
2 p3.8xlarge spot machines; when 200 iterations are done one spot machine is
taken away, Srifty marks p3.8xlarge spot depleted and re-plans the remaining
200 iterations with the time left (8 g3.8xlarge next to the survivor), and
the job finishes in time.

Here the same story runs end to end on this host, every cloud call real
except the cloud:

* machines come from `Ec2Provider` against a moto server on 127.0.0.1
  (real ``run_instances`` / ``describe_instances`` / ``terminate_instances``
  calls through boto3, tagged with the run id);
* the machines form a Ray cluster, as on EC2 (``--cluster cluster.yaml``,
  `thrifty.runtime.cluster.spec.config_provider`): the driver starts a Ray
  head on 127.0.0.1, the instances' user data is the join script, and the
  tests' EC2 harness (``tests/ec2_harness.py``) plays each running instance:
  its user data really runs under bash, with its own IMDSv2 server, and
  starts a Ray node on 127.0.0.1 (moto's instances have no machines behind
  them: that is the only liberty the demo takes);
* the training runtime (`thrifty.runtime.training.train`) trains the
  problem's profiled zoo model with real gloo worker processes, forked on
  each machine's node by its agent;
* the interruption is a spot ``instance-action`` notice on the interrupted
  machine's metadata service, read there by its agent; when the warning runs
  out the machine is taken as EC2 would (its node killed, the instance
  terminated in moto), unless the run gave it back first;
* the problem is the training runtime's miniature
  (``datasets/examples/local-demo-srifty54.json``) with its time limit
  widened to ``--time-limit`` (120 s: launches through the provider wait
  for moto's instances and notices for the IMDS poller), or one like it on
  the ``mlp`` model when that file is missing; its machine types are the
  local demo catalog's pseudo types (demo prices in ``datasets/examples/local-demo-catalog.json``, not quotes), so the
  plan is predicted with the measured CPU profiles of this host. moto accepts
  any instance type name, so these are launched as EC2 instances as they are.

Scaled down from the paper: a few hundred iterations in seconds instead of
minutes; the spot warning is `--warning` seconds instead of 120.

Run: ``python benchmarks/ec2_demo.py`` (about a minute on 2 cores). Prints
the timeline and the run's figures; exit 1 if any instance is left running
in moto at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the local AWS stand-ins the tests use

from aws_fakes import FAKE_AWS_ENV, UNSET_AWS_ENV, MotoServer, free_port  # noqa: E402
from ec2_harness import Ec2Harness  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from thrifty.datasets.paths import DATA_DIR  # noqa: E402

console = Console()
CATALOG = DATA_DIR / "examples" / "local-demo-catalog.json"


SCENARIO = DATA_DIR / "examples" / "local-demo-srifty54.json"  # the training runtime's miniature, when shipped


def load_scenario(args: argparse.Namespace):
    """The runtime's miniature Srifty 5.4 problem, or (when it is not there)
    one like it: every demo type in both markets, spot quota 2, on-demand 4."""
    from thrifty.datasets.catalog import load_catalog
    from thrifty.solver.problem import load_problem, parse_problem

    if args.problem:
        return load_problem(args.problem)
    if SCENARIO.exists():
        # the same job, with the time limit widened to --time-limit: through the ec2 provider each
        # launch also waits for the instances to run in moto and each notice for the IMDS poller
        problem = load_problem(SCENARIO)
        limit = max(problem.limits.time_s or 0.0, args.time_limit)
        return problem.model_copy(update={"limits": problem.limits.model_copy(update={"time_s": limit})})
    instances = []
    for name in load_catalog(CATALOG).types:
        instances += [{"instance_type": name, "market": "spot", "quota": 2},
                      {"instance_type": name, "market": "on_demand", "quota": 4}]
    return parse_problem({
        "kind": "training", "name": "srifty-5.4 miniature", "model": "mlp", "global_batch": 256,
        "iterations": args.iterations, "objective": "min_cost", "limits": {"time_s": args.time_limit},
        "instances": instances, "catalog": str(CATALOG), "overheads": {"launch_s": 5.0},
    })


class Interrupter:
    """At `at_iteration`, a spot notice for one spot machine of the run on its
    metadata service (played by the harness); when the warning runs out, the
    machine is taken as EC2 takes it (its node killed, the instance ended)."""

    def __init__(self, provider, harness: Ec2Harness, at_iteration: int, warning_s: float):
        self.provider, self.harness = provider, harness
        self.at_iteration, self.warning_s = at_iteration, warning_s
        self.fired: tuple[str, float] | None = None
        self.timer: threading.Timer | None = None

    def __call__(self, snapshot) -> None:
        if self.fired is not None or snapshot.iterations < self.at_iteration:
            return
        spot = sorted(m.id for m in self.provider.machines() if m.market == "spot")
        if not spot:
            return
        victim = spot[0]
        self.harness.notice(victim, in_s=self.warning_s)
        self.fired = (victim, time.time())
        self.timer = threading.Timer(self.warning_s, self._reclaim, args=(victim,))
        self.timer.daemon = True
        self.timer.start()

    def _reclaim(self, machine_id: str) -> None:
        if not self.harness.played(machine_id).killed:  # the run gave it back already
            self.harness.take_away(machine_id, notice=False)


def run(args: argparse.Namespace) -> int:
    from thrifty.runtime.cluster.spec import cluster_provider
    from thrifty.runtime.training import Hooks, RunConfig, train
    from thrifty.runtime.training.launcher import WORKER_PRELOAD
    from thrifty.runtime.training.runlog import read_run_log
    from thrifty.solver import solve

    problem = load_scenario(args)
    plan = solve(problem)
    if not plan.feasible:
        console.print(f"[red]the miniature is infeasible here: {plan.infeasibility.reason}[/red]")
        return 1
    moto = MotoServer().start()
    os.environ["AWS_ENDPOINT_URL"] = moto.url  # the driver's and (through the harness) the machines' AWS
    events: list[tuple[float, str]] = []
    hooks = Hooks()

    @hooks.on("preemption")
    def preempted(e) -> None:
        left = "" if e.time_left_s is None else f", {e.time_left_s:.1f} s left"
        events.append((e.at, f"driver hears: {e.machine_id} ({e.instance_type} {e.market}) via {e.source}{left}"))

    @hooks.on("replanned")
    def replanned(r) -> None:
        events.append((time.time(), f"re-plan {r.old_config} -> {r.new_config} in {r.latency_s:.2f} s "
                                    f"(solve {r.solve_s:.2f} s), depleted {', '.join(map(str, r.depleted))}"))
    try:
        with tempfile.TemporaryDirectory() as folder, \
                Ec2Harness(moto, Path(folder) / "instances", boot_timeout_s=90) as harness:
            config = Path(folder) / "cluster.json"
            config.write_text(json.dumps({
                "provider": "ec2", "region": "us-east-1", "ami": "ami-0123456789abcdef0", "prices": "catalog",
                "catalog": problem.catalog or str(CATALOG), "poll_interval_s": 0.5, "imds_interval_s": 0.2,
                "launch_timeout_s": 60, "join_timeout_s": 90, "tags": {"demo": "srifty-5.4"}, "install": "none",
                "head_ip": "127.0.0.1", "ray_port": free_port()}))
            harness.start()
            provider = cluster_provider(config, "srifty54-demo", problem_catalog(problem), WORKER_PRELOAD)
            try:
                interrupter = Interrupter(provider, harness, problem.iterations // 2, args.warning)
                result = train(plan, "thrifty.runtime.training.examples:zoo", problem=problem, provider=provider,
                               hooks=hooks, trainer_args={"model": problem.model}, run_dir=Path(folder) / "run",
                               run_id="srifty54-demo", on_progress=interrupter,
                               config=RunConfig(checkpoint_every=50, checkpoint_every_s=None, window_s=4.0))
                log = read_run_log(Path(folder) / "run" / "run.jsonl")
                if interrupter.timer is not None:
                    interrupter.timer.join(args.warning + 5)
            finally:
                provider.close()
            billing = provider.source.billing()  # the ec2 provider under the cluster: EC2's per-second billing
        left = moto.live_instances()
    finally:
        moto.stop()
    print_report(problem, plan, result, log, billing, events, interrupter)
    console.print(f"instances left running in moto after the run: {len(left)}")
    return 0 if not left else 1


def problem_catalog(problem):
    from thrifty.datasets.catalog import load_catalog

    return load_catalog(problem.catalog or CATALOG)


def print_report(problem, plan, result, log, billing, events, interrupter) -> None:
    start = next(e["at"] for e in log if e["event"] == "start")
    console.print(f"[bold]{problem.name}[/bold]: {problem.model}, global batch {problem.global_batch}, "
                  f"{problem.iterations} iterations, min cost under {problem.limits.time_s:g} s")
    console.print(f"plan: {plan.config}, predicted {plan.predicted.total_s:.1f} s, ${plan.predicted.cost_usd:.4f}")
    timeline = [(e["at"], _describe(e)) for e in log if e["event"] in SHOWN]
    if interrupter.fired:
        timeline.append((interrupter.fired[1], f"IMDS: spot instance-action 'terminate' posted for "
                                               f"{interrupter.fired[0]}"))
    timeline += events
    table = Table(title="timeline (seconds since the run started)")
    table.add_column("t", justify="right")
    table.add_column("event")
    for at, text in sorted(timeline):
        table.add_row(f"{at - start:7.2f}", text)
    console.print(table)
    machines = Table(title="machines (moto instances through the ec2 provider; per-second billing, 60 s minimum)")
    for col in ("instance", "type", "market", "up s", "billed s", "$/h", "cost $"):
        machines.add_column(col, justify="left" if col in ("instance", "type", "market") else "right")
    for b in billing:
        up = (b["terminated_at"] or time.time()) - b["launched_at"]
        machines.add_row(b["machine_id"], b["instance_type"], b["market"], f"{up:.1f}", f"{b['billed_s']:.1f}",
                         f"{b['price_per_hour']:.2f}", f"{b['cost_usd']:.4f}")
    console.print(machines)
    console.print(f"finished {result.iterations}/{result.total_iterations} iterations in {result.elapsed_s:.1f} s "
                  f"(limit {problem.limits.time_s:g} s), cost ${result.cost_usd:.4f} by the runtime, "
                  f"${sum(b['cost_usd'] for b in billing):.4f} by the provider's billing; configs "
                  f"{' -> '.join(p.config for p in result.plans)}; within limits: {result.within_limits}")


SHOWN = ("provision", "world_formed", "preemption", "segment_end", "terminate", "finish")


def _describe(e: dict) -> str:
    kind = e["event"]
    if kind == "provision":
        return f"provisioned {len(e['machines'])} {e['instance_type']} ({e['market']}): {', '.join(e['machines'])}"
    if kind == "world_formed":
        return f"workers formed (segment {e['segment']}), from iteration {e['start_iteration']}"
    if kind == "preemption":
        where = f" at iteration {e['iteration']}" if e.get("iteration") is not None else ""
        return f"run log: preemption of {e.get('machine_id')}{where}"
    if kind == "segment_end":
        return f"segment {e['index']} ended ({e['ended']}) at iteration {e['reached_iteration']}, " \
               f"checkpoint at {e['committed_iteration']}"
    if kind == "terminate":
        return f"terminated {', '.join(e['machines'])}"
    return f"finished: {e['iterations']} iterations, ${e['cost_usd']:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", help=f"a training problem (default: {SCENARIO.name} when shipped, else one "
                                      "built from the demo catalog)")
    ap.add_argument("--iterations", type=int, default=400, help="for the built problem (default 400)")
    ap.add_argument("--time-limit", type=float, default=120.0,
                    help="time limit, seconds (default 120; the shipped scenario's 30 s is widened to it)")
    ap.add_argument("--warning", type=float, default=3.0, help="spot warning in seconds (EC2: 120)")
    args = ap.parse_args()
    for key in UNSET_AWS_ENV:
        os.environ.pop(key, None)
    os.environ.update(FAKE_AWS_ENV)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
