"""Write ``datasets/examples/README.md``: each Srifty 5.2 case study, the
paper's choice and measured figures (Srifty, MLSys 2022, section 5.2, from
``datasets/published/srifty-case-studies.json``), thrifty's prediction for
that choice, and what thrifty chooses on the shipped derived profiles. Run from the repository root:
``python datasets/scripts/make_examples_readme.py``; ``--check`` only says
whether the file is stale (what would change), exit 1 if it is. Solve times
vary from run to run and machine to machine, so the check ignores them
(tests/test_examples_readme.py runs it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thrifty.datasets.published import CaseStudy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "datasets" / "examples"

HEADER = """# Example problems: the case studies of Srifty 5.2

Each file is one case study of the Srifty paper (MLSys 2022, section 5.2) as a
thrifty problem: the model, global batch, quotas, objective and limits as in
the paper, priced with the paper's hourly rates (`../catalog/srifty-2022.json`)
and predicted with the shipped *derived* GPU profiles (`../profiles/derived/`,
no GPU was measured for them) and the derived allreduce model of cloud GPU
types (`../allreduce/cloud-derived-model.json`, from published figures; no
EC2 probes ship). The paper gives no iteration count for cases 1-5; these files
use 1000 (it scales time and cost, not the choice). Batch 2.1K of case 6 is
2176 and 6K of case 7 is 6144, the sums of the configurations the paper lists.

The paper's measurements are in `../published/srifty-case-studies.json`;
`python benchmarks/srifty_cases.py` compares thrifty's prediction with every
configuration the paper measured and says which profiles were calibrated on
a case's own rows.

Run one: `thrifty solve datasets/examples/srifty-case6-inception.json`.
Regenerate this table: `python datasets/scripts/make_examples_readme.py`.

| case | objective | paper's choice | paper measured | thrifty predicts it | thrifty's choice | it predicts | solve |
|---|---|---|---|---|---|---|---|
"""


FOOTER = """
Other examples here:

- `heterogeneous-resnet50.json`: the main job of the README (`thrifty solve`):
  ResNet-50 on spot machines of today's us-east-1 catalog, 5000 iterations at
  the least cost within 30 minutes and $6; no one type's quota meets the
  deadline, so the plan mixes types.
- `tune-digits.json`: the tuning main job (`thrifty tune`): HyperSched on the
  digits MLP, 32 configurations, 2 workers of this host, a 2-minute deadline.
- `rubberband-sha32-resnet101.json`: a RubberBand tuning problem (`thrifty solve`
  gives the stage plan at the least cost under its deadline).
- `local-demo-srifty54.json` with `local-demo-catalog.json`: Srifty 5.4 in
  miniature on worker processes of this host (`thrifty run`).
- `cnn/train.py`: a user's own training loop, the job contract of
  `runtime/ddp/context.py` as a user writes it (`train(ctx, lr=...,
  weight_decay=..., ...)`): a small CNN, a OneCycle schedule, bf16
  autocast, gradient clipping, gradient accumulation over micro-batches, an
  evaluation on held-out images at each epoch's end, and its checkpoint
  (model, optimizer, schedule, gradient scaler) restored on resume. Its data
  is synthetic and derived: `synthetic_images` in the file makes it from a
  seed (class templates of Gaussian noise, each sample its class's template
  shifted by up to two pixels plus noise); nothing is downloaded or shipped.
- `cnn-job.json`: a training problem that names that loop as its job
  (`"job": "cnn/train.py:train"`, read from this folder) on the local demo
  types of `local-demo-catalog.json` (demo prices): `thrifty profile`,
  `thrifty solve` and `thrifty run` take it with no other input (the
  README's `thrifty run` section).
"""


def row(path: Path, study: "CaseStudy") -> str:
    from thrifty.solver.plan import Plan
    from thrifty.solver.solve import solve

    plan = solve(path)
    assert isinstance(plan, Plan)  # the case studies are training problems
    assert plan.solver is not None  # solve() says how it solved
    choice = study.papers_choice
    paper, measured = ("UNSAT", "-") if choice is None else (choice.config, study.measured_text(choice))
    for_it = "-" if choice is None else prediction_for(path, study, choice.config)
    if plan.feasible:
        p = plan.predicted
        assert p is not None  # solve() predicts a plan it finds
        config = plan.config.replace("xlarge", "xl")
        if plan.objective == "min_cost":
            per_iter = p.cost_usd / plan_iterations(path) * 100
            predicted = f"{p.iteration_s:.3f} s/iter, {per_iter:.4f} cents/iter"
        else:
            predicted = f"{p.iteration_s:.3f} s/iter, total {p.total_s:.0f} s, ${p.cost_usd:.2f}"
    else:
        assert plan.infeasibility is not None  # solve() explains a problem without a plan
        config = "infeasible (" + ", ".join(plan.infeasibility.conflicts) + ")"
        need = plan.infeasibility.limits_needed()
        predicted = (f"fastest plan needs {need['limits.time_s']:.0f} s and ${need['limits.cost_usd']:.2f}"
                     if need else "-")
    return (f"| {path.stem} | {plan.objective} | {paper} | {measured} | {for_it} | {config} | {predicted} | "
            f"{plan.solver.wall_s:.2f} s |")


def prediction_for(path: Path, study: "CaseStudy", config: str) -> str:
    """thrifty's prediction for the paper's configuration, in the paper's metric."""
    from thrifty.datasets.published import parse_paper_config
    from thrifty.solver.problem import TrainingProblem, load_problem
    from thrifty.solver.training import TrainingSpace

    problem = load_problem(path)
    assert isinstance(problem, TrainingProblem)  # the case studies are training problems
    space = TrainingSpace(problem)
    candidate = space.candidate(parse_paper_config(config, [c.itype.name for c in space.choices]))
    return study.in_metric(space.evaluate(candidate).iteration_s, space.rate_per_hour(candidate), problem.iterations)


def plan_iterations(path: Path) -> int:
    import json

    return int(json.loads(path.read_text())["iterations"])


def render() -> str:
    """The README as the shipped problems, profiles and solver give it now."""
    from thrifty.datasets.published import load_case_studies

    studies = {s.case: s for s in load_case_studies()}
    rows = [row(p, studies[p.stem]) for p in sorted(EXAMPLES.glob("srifty-case*.json"))]
    return HEADER + "\n".join(rows) + "\n" + FOOTER


SOLVE_TIME = re.compile(r"\| [0-9.]+ s \|$")


def stale_lines(current: str, fresh: str) -> list[str]:
    """The lines that differ between two versions of the README, solve times aside."""
    def norm(text: str) -> list[str]:
        return [SOLVE_TIME.sub("| (time) |", line) for line in text.splitlines()]

    old, new = norm(current), norm(fresh)
    out = [f"- {a}\n+ {b}" for a, b in zip(old, new) if a != b]
    if len(old) != len(new):
        out.append(f"{len(old)} lines, {len(new)} expected")
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from thrifty.core.io import atomic_write_text

    fresh = render()
    if "--check" in (argv if argv is not None else sys.argv[1:]):
        stale = stale_lines((EXAMPLES / "README.md").read_text(), fresh)
        print("\n".join(stale) if stale else "datasets/examples/README.md is up to date")
        return 1 if stale else 0
    atomic_write_text(EXAMPLES / "README.md", fresh)
    print(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
