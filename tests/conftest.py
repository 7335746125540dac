"""Markers by suite, in one place: ``-m "not process"`` runs the tests that
start no worker processes, ``-m "not moto"`` those that start no moto server.
The shared helpers of the tests (``aws_fakes``, ``helpers``) import as
top-level modules through ``pythonpath`` in pyproject.toml."""

from __future__ import annotations

import pytest

PROCESS_SUITES = {"test_training_runtime_processes", "test_run_behaviour", "test_tuning_executors",
                  "test_profiler", "test_scaling_profiler", "test_probe", "test_ray_schedulers",
                  "test_cli_hygiene", "test_ec2_join", "test_cluster_ec2", "test_cluster_head", "test_cluster_tuning",
                  "test_cluster_netns", "test_tune_command"}
MOTO_SUITES = {"test_ec2_provider", "test_catalog", "test_imds", "test_ec2_join", "test_cluster_ec2",
               "test_cluster_head"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        suite = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if suite in PROCESS_SUITES:
            item.add_marker(pytest.mark.process)
        if suite in MOTO_SUITES:
            item.add_marker(pytest.mark.moto)
