"""`DriverLog`: while a cluster run's driver runs, what Ray and torch print in
its process goes to the run's log, and thrifty's own lines to the terminal.

Each case runs in a process of its own, whose stdout and stderr are pipes
the test reads (the terminal), with the real sources of the lines a user
saw: Ray's ``ray`` logger, a message the cluster publishes to its drivers
(printed by Ray's listener thread), torch's C++ log and stack trace of a
rendezvous store whose host went away, a line written to file descriptor 2
by native code, and a Python warning.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent('''
    import logging, os, subprocess, sys, warnings
    from datetime import timedelta

    import ray  # imported first, as the provider does: its logger is set up
    import ray._private.worker as ray_worker
    import torch.distributed as dist

    from thrifty.runtime.cluster.driver_log import DriverLog

    server = subprocess.Popen([sys.executable, "-c", "import sys, time, torch.distributed as d; "
                               "from datetime import timedelta; s = d.TCPStore('127.0.0.1', 0, None, True, "
                               "timedelta(seconds=60), wait_for_workers=False); print(s.port, flush=True); "
                               "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    store = dist.TCPStore("127.0.0.1", int(server.stdout.readline()), None, False, timedelta(seconds=10))

    print("thrifty: before", flush=True)
    with DriverLog(sys.argv[1]):
        print("thrifty: a line on stdout")
        print("thrifty: a line on stderr", file=sys.stderr)
        logging.getLogger("ray._private.worker").info("Connecting to existing Ray cluster at address: 1.2.3.4:5")
        ray_worker.print_to_stdstream({"lines": ["[state-dump] NodeManager:"], "pid": "raylet", "is_err": False},
                                      ignore_prefix=False)
        server.kill()
        server.wait()
        try:
            store.check(["key"])  # torch logs "recvValue failed" with its C++ stack, then raises
        except Exception as e:
            print(f"thrifty: the store is gone ({type(e).__name__})")
        os.write(2, b"native: a line on descriptor 2\\n")
        warnings.warn("a library warning")
    print("thrifty: after", flush=True)
    print("thrifty: after, on stderr", file=sys.stderr, flush=True)
    logging.getLogger("ray").warning("ray: after the run")
''')


def test_ray_and_torch_output_goes_to_the_log_and_thrifty_lines_to_the_terminal(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    log = tmp_path / "logs" / "driver.log"
    done = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["thrifty: before", "thrifty: a line on stdout",
                                        "thrifty: the store is gone (DistNetworkError)", "thrifty: after"]
    assert done.stderr.splitlines()[:2] == ["thrifty: a line on stderr", "thrifty: after, on stderr"]
    assert "ray: after the run" in done.stderr  # Ray's logger is as it was once the log stops
    for foreign in ("Connecting to existing", "state-dump", "recvValue", "frame #", "native:", "a library warning"):
        assert foreign not in done.stdout + done.stderr, foreign
    text = log.read_text()
    for seen in ("Connecting to existing Ray cluster at address: 1.2.3.4:5", "[state-dump] NodeManager:",
                 "[c10d] recvValue failed", "frame #0", "native: a line on descriptor 2", "UserWarning: a library "
                 "warning"):
        assert seen in text, seen
    assert "thrifty:" not in text


def test_the_log_leaves_streams_it_does_not_own_alone(tmp_path):
    """A stream that is not its descriptor (a notebook's, say) keeps its writes; only the descriptor goes to
    the log."""
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent('''
        import io, os, sys
        from thrifty.runtime.cluster.driver_log import DriverLog

        cell, real = io.StringIO(), sys.stdout
        sys.stdout = cell
        with DriverLog(sys.argv[1]):
            print("a line of the notebook")
            os.write(1, b"native\\n")
        sys.stdout = real
        print(repr(cell.getvalue()))
    '''))
    log = tmp_path / "driver.log"
    done = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr("a line of the notebook\n") and done.stderr == ""
    assert log.read_text() == "native\n"
