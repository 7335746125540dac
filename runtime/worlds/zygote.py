"""The fork server every worker process of thrifty starts from: torch is
imported once, workers are forked.

Starting a worker as a fresh interpreter costs an interpreter start and a
torch import per rank (seconds of CPU each; `benchmarks/runtime_overheads.py`
measures it), and every re-plan or trial relaunch pays it again. A process
instead starts one *zygote* (``python -m thrifty.runtime.worlds.zygote``,
a subprocess) that imports torch and the modules its users name, and then
forks a worker for each launch request. Unlike multiprocessing's forkserver
it never imports the caller's ``__main__`` in the workers, so a user's script
needs no ``if __name__ == "__main__"`` guard.

Protocol, one JSON object per line. The caller writes
``{"preload": [module, ...]}`` (import these now, so every later fork has
them) or ``{"launch": id, "entry": "module:function", "argv": [...], "env":
{...}, "log": path, "sys_path": [...], "cwd": folder}``: the worker sets its
environment, ``sys.path`` and working folder to the caller's (relative paths
mean what they mean to the caller, whose folder may have changed since the
zygote started), sends its output to `log`, and calls
``function(argv)``; it ends with ``os._exit`` (70 if `function` returned
without ending the process). The zygote answers ``{"launched": id, "pid":
pid}`` and, when a worker ends, ``{"exit": pid, "code": code}`` (negative:
killed by that signal, as ``subprocess`` reports it). The caller kills
workers by pid. When the caller exits, however it exits, the zygote's stdin
closes and it kills its workers and leaves; each worker also dies with the
zygote (``PR_SET_PDEATHSIG``), so nothing outlives a run.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from thrifty.runtime.worlds.errors import WorldFailed
from thrifty.runtime.worlds.progress import wait_for_process

__all__ = ["Zygote", "WorkerProcess", "zygote", "start_zygote", "die_with_parent", "BASE_PRELOAD"]

# every worker world uses these: torch, its collectives and DDP's lazy imports
BASE_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.tensor.parallel.ddp",
                "thrifty.runtime.worlds.rank")


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the parent still kills its children on exit
        pass


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# -- the zygote process -----------------------------------------------------------------

_WAKE: list[int] = []  # the fork server's wake-up pipe (read end, write end), which its children close


def _wake_on_child_exit() -> tuple[int, int]:
    """A pipe that gets a byte whenever a child exits: Python's wakeup fd, written by its C-level handler of
    SIGCHLD (which needs a Python handler to be installed; this one does nothing)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return read, write


def _child(request: dict[str, Any]) -> None:  # pragma: no cover - runs in a forked worker
    try:
        # not the fork server's wake-up: the worker's own children (a DataLoader's) exit as by default
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in _WAKE:
            os.close(fd)
        die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask decides
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(request["env"])
        if "cwd" in request:  # the caller's, which may have changed since the zygote started: relative paths
            os.chdir(request["cwd"])
        sys.path[:] = request["sys_path"]  # the caller's, so its trainer modules import here too
        from thrifty.runtime.worlds.factory import resolve_factory

        resolve_factory(request["entry"], returns="nothing (a worker's entry point)")(request["argv"])
    finally:
        os._exit(70)


def _preload(modules: Any) -> None:  # pragma: no cover - runs in the zygote
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the worker that needs it imports it again and says why
            sys.stderr.write(f"thrifty fork server: cannot preload {name}: {type(e).__name__}: {e}\n")


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> None:  # pragma: no cover - runs in the zygote
    # No PR_SET_PDEATHSIG here: it fires when the parent *thread* exits, and the
    # driver may start the zygote from a thread that ends before the run does.
    # The zygote leaves when its stdin closes, which happens when the driver
    # process exits, however it exits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the driver, which stops everything
    children: set[int] = set()
    try:
        _serve(children)
    except BrokenPipeError:
        # The driver closed its end of our stdout: it exited (an early exit 2, a
        # resume that had nothing to do) while we imported torch or a worker
        # ended, and we wrote after it. Nobody reads us any more: leave quietly
        # (stdout to the null device, so that the exit's flush does not fail too).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for pid in children:  # the driver is gone or done: so are the workers
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already
            pass


def _serve(children: set[int]) -> None:  # pragma: no cover - runs in the zygote
    """Preload, say ready, and fork workers on request until stdin closes."""
    # every worker trains under the allocator policy the profiles were measured under
    from thrifty.runtime.worlds.allocator import settle

    settle()
    # imported once, inherited by every fork: torch, what DDP's constructor imports
    # (torch._dynamo, some 800 modules) and the modules the caller names
    _preload(BASE_PRELOAD + tuple(sys.argv[1:]))
    _send({"ready": os.getpid()})
    buffer = b""
    stdin = sys.stdin.fileno()
    # a child's exit wakes the loop (a byte on this pipe: SIGCHLD, through Python's wakeup fd), so the
    # loop sleeps until there is something to do; it polled every 20 ms before, each fork server waking
    # 50 times a second beside the ranks it serves (the timeout is a backstop, not the way exits are seen)
    wake = _WAKE[:] = _wake_on_child_exit()
    while True:
        readable, _, _ = select.select([stdin, wake[0]], [], [], 1.0)
        if wake[0] in readable:
            try:
                while os.read(wake[0], 512):
                    pass
            except BlockingIOError:
                pass
        if stdin in readable:
            chunk = os.read(stdin, 65536)
            if not chunk:  # the driver is gone or done
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                if "preload" in request:
                    _preload(request["preload"])
                    _send({"preloaded": request["preload"]})
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(request)
                children.add(pid)
                _send({"launched": request["launch"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send({"exit": pid, "code": _exit_code(status)})


# -- the driver's side --------------------------------------------------------------------

class WorkerProcess:
    """A worker forked by the zygote: `exitcode` is None while it runs."""

    def __init__(self, owner: "Zygote", pid: int):
        self.owner, self.pid = owner, pid

    @property
    def exitcode(self) -> int | None:
        return self.owner.exit_codes.get(self.pid)

    @property
    def server_alive(self) -> bool:
        """False once the zygote is gone: no exit code will come any more."""
        return self.owner.alive

    @property
    def machine_lost(self) -> bool:
        """Never: the worker runs on the zygote's own machine."""
        return False

    def kill(self) -> None:
        if self.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.owner.changed:
            while self.exitcode is None and self.owner.alive:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.owner.changed.wait(left)


class Zygote:
    """The caller's handle on one zygote process. `start_timeout_s` is in
    the zygote's own CPU seconds (`thrifty.runtime.worlds.progress`): its
    imports take the same CPU time on a loaded host, many times the wall time."""

    def __init__(self, start_timeout_s: float = 120.0, preload: Sequence[str] = ()):
        self.preloaded = set(BASE_PRELOAD) | set(preload)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "thrifty.runtime.worlds.zygote_main", *preload], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=None, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self._stdin: IO[bytes] = self.proc.stdin
        self._stdout: IO[bytes] = self.proc.stdout
        self.exit_codes: dict[int, int] = {}
        self.launched: dict[int, int] = {}
        self.changed = threading.Condition()
        self.alive = True
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        answer: list[dict[str, Any] | None] = []
        waited = wait_for_process(self.proc.pid, lambda seconds: self._answered(seconds, answer),
                                  cpu_limit_s=start_timeout_s)
        if not waited or not answer or answer[0] is None or "ready" not in answer[0]:
            self.close()
            why = waited.reason if not waited else f"it exited (code {self.proc.poll()})"
            raise WorldFailed(f"the worker fork server did not start: {why}")
        self._reader = threading.Thread(target=self._read, name="thrifty-zygote-reader", daemon=True)
        self._reader.start()

    def _answered(self, timeout_s: float, answer: list[dict[str, Any] | None]) -> bool:
        """Wait up to `timeout_s` for the zygote's first message; when one came
        (or its output ended: None), append it to `answer` and say True. A
        line that is not JSON (a library printing while imported) is skipped."""
        readable, _, _ = select.select([self._stdout], [], [], timeout_s)
        if not readable:
            return False
        line = self._stdout.readline()
        if not line:
            answer.append(None)
            return True
        try:
            answer.append(json.loads(line))
        except ValueError:
            return False
        return True

    def _read(self) -> None:
        try:
            for line in self._stdout:
                try:
                    message = json.loads(line)
                except ValueError:  # not ours (a library printing): skip it
                    continue
                with self.changed:
                    if "exit" in message:
                        self.exit_codes[message["exit"]] = message["code"]
                    elif "launched" in message:
                        self.exit_codes.pop(message["pid"], None)  # a reused pid is a new process
                        self.launched[message["launched"]] = message["pid"]
                    self.changed.notify_all()
        finally:
            with self.changed:
                self.alive = False
                self.changed.notify_all()

    def preload(self, modules: Sequence[str]) -> None:
        """Have the zygote import `modules` (once each), so that every later
        worker starts with them imported."""
        fresh = [m for m in modules if m not in self.preloaded]
        if fresh:
            self._write({"preload": fresh})
            self.preloaded.update(fresh)

    def _write(self, request: dict[str, Any]) -> None:
        """Send a request; `WorldFailed` when the zygote is gone (its stdin
        closed: writing to it would raise `BrokenPipeError`)."""
        with self._lock:
            try:
                self._stdin.write((json.dumps(request) + "\n").encode())
                self._stdin.flush()
            except (BrokenPipeError, ValueError) as e:  # ValueError: closed by `close` already
                raise WorldFailed(f"the worker fork server has exited (code {self.proc.poll()})") from e

    def launch(self, entry: str, argv: list[str], env: dict[str, str], log_path: str,
               timeout_s: float = 30.0, sys_path: Sequence[str] = ()) -> WorkerProcess:
        """Fork a worker that calls ``entry(argv)`` (`entry` is
        ``module:function``) with `env` over this process's environment, its
        output in `log_path`, and this process's ``sys.path`` after `sys_path`."""
        request_id = next(self._ids)
        path = [p for p in sys_path if p not in sys.path] + sys.path
        self._write({"launch": request_id, "entry": entry, "argv": argv, "env": {**os.environ, **env},
                     "log": os.path.abspath(log_path), "sys_path": path, "cwd": os.getcwd()})
        def answered(seconds: float) -> bool:
            with self.changed:
                if request_id not in self.launched and self.alive:
                    self.changed.wait(seconds)
                return request_id in self.launched or not self.alive

        # the zygote may first import what was preloaded before this request: its own CPU time is the clock
        waited = wait_for_process(self.proc.pid, answered, cpu_limit_s=timeout_s, stall_s=timeout_s)
        with self.changed:
            if request_id not in self.launched:
                why = "it exited" if not self.alive else waited.reason
                raise WorldFailed(f"the worker fork server did not start a worker ({why})")
            return WorkerProcess(self, self.launched.pop(request_id))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._stdin.close()  # the zygote kills its workers and exits
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10.0)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):  # a Ctrl-C while closing: no waiting then
                self.proc.kill()
                self.proc.wait(timeout=10.0)


_shared: Zygote | None = None
_shared_lock = threading.Lock()


def zygote(preload: Sequence[str] = ()) -> Zygote:
    """This process's zygote, started on first use (and again if it died),
    with `preload` imported in it."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.proc.poll() is not None or not _shared.alive:
            import atexit

            _shared = Zygote(preload=preload)
            atexit.register(_shared.close)
        else:
            try:
                _shared.preload(preload)
            except WorldFailed:  # it died since the check above: a new one
                _shared = Zygote(preload=preload)
                atexit.register(_shared.close)
        return _shared


def start_zygote(preload: Sequence[str] = ()) -> None:
    """Start this process's zygote in the background (its torch import takes
    seconds), so that a run's first world does not wait for it while its
    machines boot; a failure is reported by the `zygote()` call that needs it."""
    def start() -> None:
        try:
            zygote(preload)
        except Exception:  # noqa: BLE001 - the launch that needs the zygote tries again and says why
            pass

    threading.Thread(target=start, name="thrifty-zygote-start", daemon=True).start()

