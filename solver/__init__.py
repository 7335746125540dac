"""thrifty.solver: problems, formulations, search and ``solve()``.

The public entry points (docs/architecture.md, "Contracts")::

    from thrifty.solver import solve, Problem, Plan
"""

from thrifty.solver.plan import Plan
from thrifty.solver.problem import Problem
from thrifty.solver.solve import solve

__all__ = ["solve", "Problem", "Plan"]
