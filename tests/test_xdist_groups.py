"""The parallel suite keeps a module's shared setup on one worker
(tests/conftest.py): under pytest-xdist with ``--dist loadgroup`` (the
README's test command), a test that uses a module-scoped fixture carries its
module's group in its id, which is what xdist schedules by. With pytest 9.2,
whose ids no longer come from the attribute xdist 3.8 sets, no test had one:
each module's tests went to whichever worker was free, and a module with a
Ray cluster started its cluster on each of them (pyproject.toml pins pytest
below 9.2)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def shared() -> object:
    return object()


def test_a_test_sharing_a_module_fixture_is_scheduled_with_its_module(shared, request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("this checks the parallel run: pytest -n auto with --dist loadgroup (pyproject.toml's addopts)")
    assert request.node.nodeid.endswith("@test_xdist_groups"), request.node.nodeid
