"""Markers by suite, in one place: ``-m "not process"`` runs the tests that
start no worker processes, ``-m "not moto"`` those that start a moto server.
The shared helpers of the tests (``aws_fakes``, ``helpers``) import as
top-level modules through ``pythonpath`` in pyproject.toml.

The suite runs in parallel (``-n auto``, pytest-xdist, with ``--dist
loadgroup`` from pyproject.toml): each test goes to whichever worker process
is free, except that the tests of a module with a module- or class-scoped
fixture (a Ray cluster, a moto server, a fork server, a fitted model) form
one ``xdist_group`` named after the module, so they run on one worker and
share that setup once instead of building it on every worker. Tests must
not rely on each other's order or leftovers, take no fixed port (ask the OS
for one: ``aws_fakes.free_port``) and no fixed path outside ``tmp_path``."""

from __future__ import annotations

import pytest

PROCESS_SUITES = {"test_training_runtime_processes", "test_run_behaviour", "test_tuning_executors",
                  "test_profiler", "test_scaling_profiler", "test_probe", "test_ray_schedulers",
                  "test_cli_hygiene", "test_ec2_join", "test_cluster_ec2", "test_cluster_head", "test_cluster_tuning",
                  "test_cluster_netns", "test_tune_command"}
MOTO_SUITES = {"test_ec2_provider", "test_catalog", "test_imds", "test_ec2_join", "test_cluster_ec2",
               "test_cluster_head"}
SHARED_SCOPES = {"module", "class", "package"}


def shares_a_setup(item: pytest.Item) -> bool:
    """Whether `item` uses a fixture wider than one test but narrower than
    the session: one that its module's other tests would otherwise rebuild
    on another worker (session fixtures are built once per worker anyway)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definition.scope in SHARED_SCOPES
               for definitions in info.name2fixturedefs.values() for definition in definitions)


# first: xdist's worker reads the xdist_group marks in its own hook of the same name (no order given)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        suite = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if suite in PROCESS_SUITES:
            item.add_marker(pytest.mark.process)
        if suite in MOTO_SUITES:
            item.add_marker(pytest.mark.moto)
        if shares_a_setup(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(suite))


@pytest.fixture
def providers(monkeypatch):
    """Every provider a command makes, kept to look at after it closed them."""
    import thrifty.runtime.cluster.spec as spec

    made: list = []
    real = spec.cluster_provider

    def keep(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(spec, "cluster_provider", keep)
    return made
