"""Training runtime (issue 5): run a training plan with heterogeneous batches, monitor, re-plan."""
