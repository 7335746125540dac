"""Tuning runtime (issue 6): trials, deadline-aware schedulers, executors."""
