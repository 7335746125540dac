"""The ``process`` marker is derived from what a test's code uses
(tests/markers.py), not from a list of modules: these check the derivation
on small functions, and on the worker-world tests, which fork ranks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from markers import command_launches, launching_modules, starts_processes, uses_moto, why_processes
from thrifty.runtime.cli import main
from thrifty.runtime.worlds import World


def _forks() -> None:
    if os.fork() == 0:
        os._exit(0)


def _through_a_helper() -> None:
    _forks()


def _runs_a_subprocess() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _starts_a_world(world: World) -> World:  # an annotation alone would start nothing
    return World(1, "m:f", [])


def _annotated_only(world: World) -> int:
    return 1


def _trains() -> None:
    main(["run", "plan.json", "--trainer", "m:f"])


def _solves() -> None:
    main(["solve", "problem.json"])


def _imports_the_tuning_driver() -> None:
    from thrifty.runtime.tuning.driver import tune  # noqa: F401


def _imports_a_scheduler_from_the_tuning_package() -> None:
    from thrifty.runtime.tuning import HyperSched  # noqa: F401 -- re-exported beside the world executor


def _pure() -> int:
    return sum(range(3))


@pytest.mark.parametrize("code, why", [
    ([_forks], "os.fork"),
    ([_through_a_helper], "_forks: os.fork"),
    ([_runs_a_subprocess], "subprocess.run"),
    ([_starts_a_world], "thrifty.runtime.worlds.world.World"),
    ([_trains], "thrifty run"),
    ([_imports_the_tuning_driver], "thrifty.runtime.tuning.driver.tune"),
    ([_pure, _forks], "os.fork"),  # a fixture that starts processes makes its test a process test
])
def test_code_that_starts_processes_is_found(code, why):
    found = why_processes(code)
    assert found is not None and found.endswith(why), found
    assert starts_processes(code)


@pytest.mark.parametrize("code", [[_pure], [_solves], [_annotated_only],
                                  [_imports_a_scheduler_from_the_tuning_package]])
def test_code_that_starts_nothing_is_not_a_process_test(code):
    assert why_processes(code) is None


def test_launching_is_read_off_the_library():
    launching = launching_modules()
    assert {"thrifty.runtime.worlds.zygote", "thrifty.runtime.tuning.executors.worlds",
            "thrifty.runtime.training.driver", "thrifty.runtime.measure.profiler"} <= launching
    assert not {m for m in launching if m.startswith(("thrifty.solver", "thrifty.perfmodels", "thrifty.core"))}
    assert "thrifty.runtime.tuning.schedulers.hypersched" not in launching
    assert command_launches("run") and command_launches("tune") and command_launches("profile")
    assert not command_launches("solve") and not command_launches("simulate") and not command_launches("nope")


def test_the_worker_world_tests_are_process_tests():
    import test_worlds

    tests = [getattr(test_worlds, name) for name in dir(test_worlds) if name.startswith("test_")]
    assert len(tests) >= 5
    assert [t.__name__ for t in tests if not starts_processes([t])] == []


def _moto_server():
    from aws_fakes import moto_server

    with moto_server() as server:
        yield server


def _needs_moto():
    pytest.importorskip("moto")  # an import by name: what datasets/scripts/build_catalog.py fakes AWS with


@pytest.mark.parametrize("code, moto, process", [
    ([_pure, _moto_server], True, False),  # through aws_fakes.MotoServer; moto's server is a thread, not a process
    ([_needs_moto], True, False),
    ([_forks], False, True),
    ([_trains], False, True),
])
def test_moto_is_sought_in_the_same_reading(code, moto, process):
    assert uses_moto(code) is moto and starts_processes(code) is process
