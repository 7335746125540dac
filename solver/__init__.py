"""thrifty.solver: problems, formulations, search and solve() (issue 3 onward)."""

__all__: list[str] = []
