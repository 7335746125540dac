"""Tuning runtime (issue 6): trials, deadline-aware schedulers, executors.

One loop (`run_experiment`) drives a `Scheduler` and an executor under a
real or virtual `Clock`; schedulers cannot tell which. Schedulers: `FIFO`
(HyperDrive's Default), `ASHA`, `HyperSched`, `POP`, `Bandit`, `EarlyTerm`.
`SimulatedExecutor` runs HyperSched's synthetic workload or replays recorded
learning curves (HyperDrive 7.1) on the virtual clock; `WorldExecutor` runs
trials as worlds of torch worker processes, on this host or (given a
`RayProvider`) on a cluster's nodes; `execute_plan` carries out a
tuning plan from the planner stage by stage (RubberBand). Ray Tune versions of
the schedulers: `thrifty.runtime.tuning.schedulers.ray_tune` (the `ray` extra).

    from thrifty.runtime.tuning import (HyperSched, SimulatedExecutor, SyntheticWorkload,
                                        run_experiment, synthetic_search_space)
    result = run_experiment(HyperSched(min_iterations=5, eta=4, max_iterations=500, scaling="SQRT"),
                            SimulatedExecutor(SyntheticWorkload("SQRT")), synthetic_search_space(seed=0),
                            total_atoms=8, max_iterations=500, deadline=30)
    result.best_metric, result.best_config
"""

from thrifty.runtime.tuning.schedulers.asha import ASHA
from thrifty.runtime.tuning.schedulers.bandit import Bandit
from thrifty.runtime.tuning.schedulers.base import (SCALINGS, Decision, ExperimentView, Scheduler, Start,
                                                    rung_milestones, scaling_function)
from thrifty.runtime.tuning.clock import Clock, RealClock, VirtualClock
from thrifty.runtime.tuning.schedulers.early_term import EarlyTerm
from thrifty.runtime.tuning.executors.worlds import WorldExecutor, TunableTrainer
from thrifty.runtime.tuning.executors.plan import (PlanExecutor, PlanResult, ProfileWorkload, StageRecord,
                                                   execute_plan, simulated_backend)
from thrifty.runtime.tuning.executors.sim import (SimulatedExecutor, SyntheticWorkload, TraceWorkload, Workload,
                                                  configuration_orders, record_traces, synthetic_score,
                                                  synthetic_search_space)
from thrifty.runtime.tuning.schedulers.fifo import FIFO
from thrifty.runtime.tuning.schedulers.forecasting import Memoized, default_forecaster
from thrifty.runtime.tuning.schedulers.hypersched import HyperSched
from thrifty.runtime.tuning.loop import (Executor, Experiment, ExperimentResult, SchedulerError, TrialFailedError,
                                         run_experiment)
from thrifty.runtime.tuning.schedulers.pop import POP
from thrifty.runtime.tuning.search_space import (CallableSearch, Choice, ConfigList, Exponential, GridSearch,
                                                 IntUniform, LogUniform, RandomSearch, SearchSpace, Uniform)
from thrifty.runtime.tuning.trial import Crash, Report, Trial, TrialState

__all__ = [
    "Trial", "TrialState", "Report", "Crash",
    "Scheduler", "Decision", "Start", "ExperimentView", "SCALINGS", "scaling_function", "rung_milestones",
    "FIFO", "ASHA", "HyperSched", "POP", "Bandit", "EarlyTerm", "Memoized", "default_forecaster",
    "Clock", "RealClock", "VirtualClock",
    "Executor", "Experiment", "ExperimentResult", "run_experiment", "SchedulerError", "TrialFailedError",
    "SimulatedExecutor", "Workload", "SyntheticWorkload", "TraceWorkload", "synthetic_score",
    "synthetic_search_space", "configuration_orders", "record_traces",
    "WorldExecutor", "TunableTrainer",
    "PlanExecutor", "PlanResult", "StageRecord", "execute_plan", "simulated_backend",
    "ProfileWorkload",
    "SearchSpace", "RandomSearch", "GridSearch", "ConfigList", "CallableSearch",
    "Uniform", "LogUniform", "IntUniform", "Choice", "Exponential",
]
