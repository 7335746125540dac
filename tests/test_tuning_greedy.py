"""RubberBand's greedy planner (Algorithm 2, section 4.3) step by step on a job
small enough to plan by hand, and thrifty's exact planner against it and the
static baseline with the fallback to greedy's plan turned off (so the
comparison can fail).

The hand-made job (`toy_problem`): one instance type with 1 GPU
(``local-a``, $1.20 an hour on demand, so 1 instance-second costs
$1/3000), per-instance billing with no billing minimum, no scale-up or
start-up latency, no straggler noise (iteration sd 0), and a scaling profile
of t(1) = 1 s, t(2) = 0.55 s, t(4) = 0.4 s per iteration. Between profiled
points the throughput is interpolated, so t(3) = 2 / (1/0.55 + 1/0.4) =
44/95 s = 0.46316 s. Stages: 4 trials x 8 iterations, 2 trials x 15, 1
trial x 30; deadline 40 s (mean JCT); at most 8 instances.

A vector a = (a0, a1, a2) gives each stage a GPUs (= instances, 1 GPU each),
shared fairly: g = min(max(1, a // n), 4) GPUs per trial, a // g trials at
once, in ceil(n / (a // g)) waves. Stage time D = waves * iters * t(g),
JCT = sum D, and cost = sum a * D instance-seconds (the cluster shrinks or
grows between stages for free). The stage tables:

    stage 0 (n=4, 8 it):   a=1: 32 s   a=2: 16 s   a=4: 8 s    a=8: 4.4 s (g=2)
    stage 1 (n=2, 15 it):  a=1: 30 s   a=2: 15 s   a=4: 8.25 s (g=2)   a=6: 6.947 s (g=3)   a=8: 6 s (g=4)
    stage 2 (n=1, 30 it):  a=1: 30 s   a=2: 16.5 s a=3: 13.895 s   a>=4: 12 s (g=4, the extra instances idle)

Algorithm 2's step (`_decrement`) is the largest smaller allocation that is a
factor or a multiple of the stage's trials: stage 0 (n=4) 8 -> 4 -> 2 -> 1,
stage 1 (n=2) 8 -> 6 -> 4 -> 2 -> 1, stage 2 (n=1) one at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.solver.problem import parse_problem
from thrifty.solver.tuning import TuningSpace, _decrement, plan_greedy, plan_static, plan_tuning, solve_cpsat

ROOT = Path(__file__).resolve().parents[1]
USD_PER_INSTANCE_S = 1.2 / 3600  # local-a on demand


@pytest.fixture(scope="module")
def toy_profile(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("greedy") / "toy__local-a.json"
    path.write_text(json.dumps({
        "format": "thrifty.scaling_profile/1", "model": "toy", "instance_type": "local-a",
        "points": [{"gpus": 1, "iteration_s": 1.0}, {"gpus": 2, "iteration_s": 0.55},
                   {"gpus": 4, "iteration_s": 0.4}]}))
    return path


def toy_problem(profile: Path, deadline_s: float = 40.0):
    return parse_problem({
        "kind": "tuning", "model": str(profile), "instance_type": "local-a",
        "catalog": str(ROOT / "datasets" / "examples" / "local-demo-catalog.json"),
        "stages": [{"trials": 4, "iters": 8}, {"trials": 2, "iters": 15}, {"trials": 1, "iters": 30}],
        "deadline_s": deadline_s, "billing": "per_instance", "cloud": {"min_billed_s": 0},
        "profile": {"iteration_sd_s": 0}, "samples": 1, "max_instances": 8})


@pytest.fixture
def toy(toy_profile) -> TuningSpace:
    return TuningSpace(toy_problem(toy_profile))


def instances(candidate) -> tuple[int, ...]:
    return tuple(a.instances for a in candidate.plan)


def recording(space: TuningSpace, monkeypatch) -> list[tuple[tuple[int, ...], float, float]]:
    """Every plan `space` simulates from now on: (instances per stage, JCT, instance-seconds)."""
    log = []
    simulate = space.simulate

    def record(plan):
        c = simulate(plan)
        log.append((instances(c), round(c.result.jct_s, 3), round(c.cost / USD_PER_INSTANCE_S, 3)))
        return c

    monkeypatch.setattr(space, "simulate", record)
    return log


@pytest.mark.parametrize("stage, allocation, step", [
    (0, 8, 4), (0, 4, 2), (0, 2, 1), (0, 1, None),   # 7, 6, 5 and 3 divide 4 no way
    (1, 8, 6), (1, 6, 4), (1, 4, 2), (1, 2, 1),      # multiples of 2, then its factor 1
    (2, 8, 7), (2, 4, 3), (2, 1, None),              # 1 trial: every count is a multiple
])
def test_decrement_is_the_next_factor_or_multiple_of_the_trials(toy, stage, allocation, step):
    assert _decrement(toy, stage, allocation, "local-a") == step


def test_static_warm_start_is_the_cheapest_static_cluster_in_time(toy):
    # m = 1: 32 + 30 + 30 = 92 s; m = 2: 16 + 15 + 16.5 = 47.5 s; m = 3: 16 + 15 + 13.895 = 44.9 s
    # (all late); m = 4: 8 + 8.25 + 12 = 28.25 s, 4 x 28.25 = 113 instance-s; m > 4: the same
    # or more time on more instances, dearer
    static = plan_static(toy)
    assert instances(static) == (4, 4, 4)
    assert [a.gpus_per_trial for a in static.plan] == [1, 2, 4]
    assert static.result.jct_s == pytest.approx(28.25)
    assert static.cost == pytest.approx(113 * USD_PER_INSTANCE_S)


def test_greedy_from_the_static_cluster_step_by_step(toy, monkeypatch):
    static = plan_static(toy)
    log = recording(toy, monkeypatch)
    best = plan_greedy(toy, static, factors=(1,))
    # Each step simulates the current vector's decrements in stage order and takes the
    # feasible one of largest (cost saved) / (time added); a candidate that saves nothing
    # (stage 0: 2 x 16 = 4 x 8 instance-s) is not taken.
    assert log == [
        ((4, 4, 4), 28.25, 113.0),      # warm start
        ((2, 4, 4), 36.25, 113.0),      # saves nothing
        ((4, 2, 4), 35.0, 110.0),       # 3 saved / 6.75 s = 0.44
        ((4, 4, 3), 30.145, 106.684),   # 6.316 / 1.895 s = 3.33  <- taken
        ((2, 4, 3), 38.145, 106.684),   # saves nothing
        ((4, 2, 3), 36.895, 103.684),   # 3 / 6.75 = 0.44
        ((4, 4, 2), 32.75, 98.0),       # 8.684 / 2.605 = 3.33    <- taken
        ((2, 4, 2), 40.75, 98.0),       # late (40.75 > 40)
        ((4, 2, 2), 39.5, 95.0),        # 3 / 6.75 = 0.44, the only one in time  <- taken
        ((4, 4, 1), 46.25, 95.0),       # late
        ((2, 2, 2), 47.5, 95.0),        # late
        ((4, 1, 2), 54.5, 95.0),        # late
        ((4, 2, 1), 53.0, 92.0),        # late: no candidate left, Algorithm 2 stops
    ]
    # Round by round: the candidates are the current vector with one stage decremented (stage
    # order), and the next round starts from the one taken; none is taken in the last round.
    current = [(4, 4, 4), (4, 4, 3), (4, 4, 2), (4, 2, 2)]  # the warm start, then each vector taken
    for r, vec in enumerate(current):
        candidates = [v for v, _, _ in log[1 + 3 * r: 4 + 3 * r]]
        assert candidates == [vec[:k] + (_decrement(toy, k, vec[k], "local-a"),) + vec[k + 1:] for k in range(3)]
        assert r + 1 == len(current) or current[r + 1] in candidates
    assert len(log) == 1 + 3 * len(current)
    assert instances(best) == (4, 2, 2)
    assert [a.gpus_per_trial for a in best.plan] == [1, 1, 2]
    assert best.result.jct_s == pytest.approx(39.5)
    assert best.cost == pytest.approx(95 * USD_PER_INSTANCE_S)


def test_greedy_from_twice_the_static_cluster(toy, monkeypatch):
    static = plan_static(toy)
    log = recording(toy, monkeypatch)
    best = plan_greedy(toy, static, factors=(2,))
    # From (8, 8, 8) (22.4 s, 179.2 instance-s): stage 2 holds 8 instances but a trial uses at most
    # 4 GPUs, so dropping one costs no time (benefit infinite) down to (8, 8, 4) (131.2); then
    # stage 1 8 -> 6 (6.316 / 0.947 = 6.67 beats stage 2's 3.33 and stage 0's 0.89), stage 1
    # 6 -> 4 (8.684 / 1.303 = 6.67), stage 2 4 -> 3 -> 2 (3.33 each, over stage 0's 0.89 and
    # stage 1's 0.44), stage 0 8 -> 4 (0.89; stage 2 -> 1 is late), stage 1 4 -> 2 (the only one
    # in time), and stop: the same plan as from the static cluster.
    path = [(8, 8, 8), (8, 8, 7), (8, 8, 6), (8, 8, 5), (8, 8, 4), (8, 6, 4), (8, 4, 4), (8, 4, 3),
            (8, 4, 2), (4, 4, 2), (4, 2, 2)]
    simulated = [vec for vec, _, _ in log]
    positions = [simulated.index(vec) for vec in path]
    assert positions == sorted(positions)  # visited in this order
    assert instances(best) == (4, 2, 2)
    assert best.cost == pytest.approx(95 * USD_PER_INSTANCE_S)


def test_greedy_never_costlier_than_its_warm_start(toy):
    static = plan_static(toy)
    for factors in ((1,), (2,), (3,), (1, 2, 3)):
        best = plan_greedy(toy, static, factors=factors)
        assert toy.feasible(best) and best.cost <= static.cost + 1e-12


def test_greedy_stays_put_when_no_step_fits_the_deadline(toy_profile):
    # deadline 30 s: the static cluster (28.25 s) is the only vector in time: every decrement
    # adds at least 1.895 s (stage 2 4 -> 3)
    space = TuningSpace(toy_problem(toy_profile, deadline_s=30.0))
    static = plan_static(space)
    assert instances(plan_greedy(space, static, factors=(1,))) == (4, 4, 4)


def test_exact_plan_on_the_toy_is_the_hand_optimum(toy):
    # Cheapest per stage: 32 (any of a = 1, 2, 4), 30 (a = 1 or 2), 30 (a = 1): 92
    # instance-s, but no such plan is in time (>= 8 + 15 + 30 = 53 s). Next: stage 2 on 2
    # (33): 32 + 30 + 33 = 95 in 8 + 15 + 16.5 = 39.5 s. Greedy finds it too.
    res = plan_tuning(toy, fallback_to_greedy=False)
    assert res.chosen == "exact"
    assert res.best.cost == pytest.approx(95 * USD_PER_INSTANCE_S)
    assert res.best.result.jct_s <= 40.0
    assert res.best.cost <= res.greedy.cost + 1e-12


# -- the exact planner against the baselines, with no fallback ------------------------------

def shipped(model: str, deadline_s: float, billing: str = "per_instance", **kw):
    data = {"kind": "tuning", "model": model, "instance_type": "p3.8xlarge", "deadline_s": deadline_s,
            "billing": billing, "experiment": {"algorithm": "sha", "trials": 16, "min_iters": 1,
                                               "max_iters": 27, "eta": 3},
            "cloud": {"scale_latency_s": 15, "init_latency_s": 15, "min_billed_s": 0},
            "profile": {"iteration_sd_s": 0}, "samples": 8, "max_instances": 16, **kw}
    return parse_problem(data)


@pytest.mark.parametrize("model, slack, billing", [
    ("resnet101", 1.2, "per_instance"), ("resnet101", 2.0, "per_instance"), ("resnet101", 3.5, "per_instance"),
    ("bert-base", 1.5, "per_instance"), ("resnet152", 2.5, "per_instance"),
    ("resnet101", 1.5, "per_function"), ("bert-base", 3.0, "per_function"),
])
def test_exact_plan_no_costlier_than_greedy_or_static(model, slack, billing):
    """With no straggler noise and no billing minimum the exact formulation's
    model is the simulator's mean exactly, so its optimum can be no dearer
    under simulation than any plan greedy or static reach (compared with the
    fallback turned off: the exact plan alone is the answer)."""
    problem = shipped(model, 10_000, billing)
    fastest = solve_cpsat(TuningSpace(problem), "min_time", None).model_jct_s
    space = TuningSpace(problem.model_copy(update={"deadline_s": fastest * slack}))
    res = plan_tuning(space, fallback_to_greedy=False)
    assert res.chosen == "exact" and res.best is not None and space.feasible(res.best)
    for baseline in (res.greedy, res.static, res.naive):
        if baseline is not None:
            assert res.best.cost <= baseline.cost * (1 + 1e-9)
