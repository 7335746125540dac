"""The search's bounds on machines that share this host (local workers):
the host's cores, time-shared by every worker's passes, bound an iteration
from below (`IterationSimulator.host_work`, `TrainingSpace.lower_bound`), so
a problem of many local workers is pruned, and its infeasibility explained,
without simulating every cluster; and the counts and caps the explanation
relies on (`count_candidates`, `search_exhaustive(max_candidates=...)`)."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from thrifty.perfmodels.cluster import MachineGroup, merge_groups
from thrifty.solver import solve
from thrifty.solver.problem import parse_problem
from thrifty.solver.search import search_exhaustive
from thrifty.solver.training import TrainingSpace, count_candidates

EXAMPLES = Path(__file__).resolve().parents[1] / "datasets" / "examples"
DEMO = EXAMPLES / "local-demo-srifty54.json"


def demo(**changes) -> dict:
    """The Srifty 5.4 miniature (tiny transformer on local-a and local-b workers of this host)."""
    problem = {**json.loads(DEMO.read_text()), "catalog": str(EXAMPLES / "local-demo-catalog.json")}
    return {**problem, **changes}


def quotas(*counts: int) -> list[dict]:
    kinds = [("local-a", "spot"), ("local-b", "spot"), ("local-a", "on_demand"), ("local-b", "on_demand")]
    return [{"instance_type": t, "market": m, "quota": q} for (t, m), q in zip(kinds, counts)]


def test_the_host_bound_stays_below_every_simulated_iteration_and_close_to_it():
    """Every cluster of up to 8 + 8 workers (two markets of each type) at a
    global batch of 128: the bound never passes the simulated mean; without
    the host's cores it was a sixth of it (the passes of 16 workers on 2
    cores take eight times their work)."""
    problem = demo(global_batch=128, limits={}, respect_threshold=False, instances=quotas(4, 4, 4, 4))
    space = TrainingSpace(parse_problem(problem))
    ratios = []
    for candidate in space.candidates():
        bound, simulated = space.lower_bound(candidate), space.evaluate(candidate).iteration_s
        assert bound <= simulated, (space.describe(candidate), bound, simulated)
        ratios.append(bound / simulated)
    assert len(ratios) > 100
    assert statistics.median(ratios) > 0.5


def test_a_local_problem_no_quota_can_save_is_explained_completely():
    """No number of local workers meets 30 s (more of them only share the
    same two cores): the time limit alone is the one conflict, proven. The
    search used to simulate every cluster of up to 32 workers, ran out of
    its time and answered with an unproven set of four."""
    plan = solve(demo(global_batch=128, instances=quotas(2, 2, 2, 2000)))
    assert plan.status == "infeasible"
    assert plan.infeasibility.conflict_sets == [["limits.time_s"]]
    assert plan.infeasibility.conflict_sets_complete


def test_one_type_at_one_batch_is_one_group_whatever_its_markets():
    space = TrainingSpace(parse_problem(demo()))
    local_a = space.choices[0].itype
    split = [MachineGroup(local_a, 1, 32), MachineGroup(local_a, 1, 32)]
    assert merge_groups(split) == [MachineGroup(local_a, 2, 32)]
    assert space.simulator.simulate(split) == space.simulator.simulate([MachineGroup(local_a, 2, 32)])


@pytest.mark.parametrize("groups,global_batches", [
    (((2, (1, 2, 4)), (3, (2, 4)), (1, (3,))), range(0, 40)),
    # a common divisor of 8: counted in units of 8 samples, none for a global batch off the unit
    (((2, (8, 16, 32)), (3, (16, 48)), (1, (24,))), range(0, 300, 4))])
def test_candidate_counts_agree_with_enumerating_every_placement(groups, global_batches):
    options = [[(0, 0)] + [(count, batch) for batch in batches for count in range(1, quota + 1)]
               for quota, batches in groups]
    for global_batch in global_batches:
        expected = sum(1 for picked in itertools.product(*options)
                       if sum(count * batch for count, batch in picked) == global_batch)
        assert count_candidates(global_batch, groups) == expected, global_batch


def test_an_exhaustive_search_past_its_cap_gives_up_without_simulating():
    space = TrainingSpace(parse_problem(demo(limits={}, instances=quotas(8, 8))))
    capped = search_exhaustive(space, any_feasible=True, max_candidates=3)
    assert capped.details["capped"] and not capped.complete and capped.best is None and capped.simulated == 0
    found = search_exhaustive(space, any_feasible=True, max_candidates=10_000)
    assert "capped" not in found.details and found.best is not None
