"""Write ``datasets/examples/README.md``: each Srifty 5.2 case study, the
paper's choice and measured figures (Srifty, MLSys 2022, section 5.2) and what
thrifty chooses on the shipped derived profiles. Run from the repository root:
``python datasets/scripts/make_examples_readme.py``; ``--check`` only says
whether the file is stale (what would change), exit 1 if it is. Solve times
vary from run to run and machine to machine, so the check ignores them
(tests/test_examples_readme.py runs it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "datasets" / "examples"

PAPER = {  # Srifty 5.2: the paper's choice and its measured latency or cost
    "srifty-case1-resnet50": ("16g4dn@8", "0.13 s/iter"),
    "srifty-case2-vgg16": ("32g3@16", "1.03 s/iter"),
    "srifty-case3-alexnet": ("2g3@512", "0.415 s/iter"),
    "srifty-case4-dlrm": ("1g4dn@1024", "0.0024 cents/iter"),
    "srifty-case5-xlm": ("4g4dn@128", "0.174 cents/iter"),
    "srifty-case5-bert": ("16g3@64", "0.343 cents/iter"),
    "srifty-case6-inception": ("4p3@512+4g4dn@32", "259 s, $1.26"),
    "srifty-case7-shufflenet": ("UNSAT", "-"),
}

HEADER = """# Example problems: the case studies of Srifty 5.2

Each file is one case study of the Srifty paper (MLSys 2022, section 5.2) as a
thrifty problem: the model, global batch, quotas, objective and limits as in
the paper, priced with the paper's hourly rates (`../catalog/srifty-2022.json`)
and predicted with the shipped *derived* GPU profiles (`../profiles/derived/`,
no GPU was measured for them) and the analytic ring allreduce model (no EC2
probes ship). The paper gives no iteration count for cases 1-5; these files
use 1000 (it scales time and cost, not the choice). Batch 2.1K of case 6 is
2176 and 6K of case 7 is 6144, the sums of the configurations the paper lists.

Run one: `thrifty solve datasets/examples/srifty-case6-inception.json`.
Regenerate this table: `python datasets/scripts/make_examples_readme.py`.

| case | objective | paper's choice | paper measured | thrifty's choice | thrifty predicts | solve time |
|---|---|---|---|---|---|---|
"""


FOOTER = """
Other examples here:

- `tune-digits.json`: the tuning main job (`thrifty tune`): HyperSched on the
  digits MLP, 32 configurations, 2 workers of this host, a 2-minute deadline.
- `rubberband-sha32-resnet101.json`: a RubberBand tuning problem (`thrifty solve`
  gives the stage plan at the least cost under its deadline).
- `local-demo-srifty54.json` with `local-demo-catalog.json`: Srifty 5.4 in
  miniature on worker processes of this host (`thrifty run`).
"""


def row(path: Path) -> str:
    from thrifty.solver.plan import Plan
    from thrifty.solver.solve import solve

    plan = solve(path)
    assert isinstance(plan, Plan)  # the case studies are training problems
    assert plan.solver is not None  # solve() says how it solved
    paper, measured = PAPER.get(path.stem, ("?", "?"))
    if plan.feasible:
        p = plan.predicted
        assert p is not None  # solve() predicts a plan it finds
        choice = plan.config.replace("xlarge", "xl")
        if plan.objective == "min_cost":
            per_iter = p.cost_usd / plan_iterations(path) * 100
            predicted = f"{p.iteration_s:.3f} s/iter, {per_iter:.4f} cents/iter"
        else:
            predicted = f"{p.iteration_s:.3f} s/iter, total {p.total_s:.0f} s, ${p.cost_usd:.2f}"
    else:
        assert plan.infeasibility is not None  # solve() explains a problem without a plan
        choice = "infeasible (" + ", ".join(plan.infeasibility.conflicts) + ")"
        needs = [r for r in plan.infeasibility.relaxations if "fields" in r]
        predicted = ("fastest plan needs " + f"{needs[-1]['needed']['limits.time_s']:.0f} s and "
                     f"${needs[-1]['needed']['limits.cost_usd']:.2f}") if needs else "-"
    return (f"| {path.stem} | {plan.objective} | {paper} | {measured} | {choice} | {predicted} | "
            f"{plan.solver.wall_s:.2f} s |")


def plan_iterations(path: Path) -> int:
    import json

    return int(json.loads(path.read_text())["iterations"])


def render() -> str:
    """The README as the shipped problems, profiles and solver give it now."""
    rows = [row(p) for p in sorted(EXAMPLES.glob("srifty-case*.json"))]
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
    from thrifty.datasets.io import atomic_write_text

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
