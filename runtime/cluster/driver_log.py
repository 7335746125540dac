"""What Ray and torch print in the driver process goes to the run's log, not
to the user's terminal: `DriverLog`.

A driver that joins a Ray cluster gets output from several places that are
not thrifty's: Ray's ``ray`` logger ("Connecting to existing Ray cluster",
INFO lines), Ray's core worker (C++; its errors and the tail of a dead
raylet's log, ``[state-dump]`` lines included), torch's C++ logging (the
driver is a client of each world's rendezvous store: when the store's
machine goes away, c10d logs ``recvValue failed ... Connection reset by
peer`` with its stack), and Python warnings from either. Ray has a setting
for part of it (``log_to_driver=False`` keeps the workers' output in the
nodes' session logs: `thrifty.runtime.cluster.connect.connect` passes it),
none for the rest, which is written to file descriptors 1 and 2.

While a `DriverLog` is started, this process's descriptors 1 and 2 write to
the log file, the ``ray`` logger and Python warnings write there too, and
``sys.stdout`` and ``sys.stderr`` (thrifty's own lines: messages, the
progress bar, the live table) go on writing to the terminal, through copies
of the descriptors they had. A stream that is not its descriptor (a
notebook's, or one captured by a test) is left alone; only the descriptor
is redirected. `stop` puts everything back; it is idempotent.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

__all__ = ["DriverLog"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d -- %(message)s"


class DriverLog:
    """Route this process's non-thrifty output to `path` between `start` and `stop`
    (see the module docstring). A context manager as well."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._saved_fds: dict[int, int] = {}
        self._streams: list[tuple[str, TextIO, _Terminal]] = []  # (sys attribute, its stream, ours)
        self._handler: logging.StreamHandler[TextIO] | None = None
        self._ray_handlers: list[logging.Handler] = []
        self._ray_propagate = True
        self._showwarning: Any = None
        self._ray_print: tuple[Any, Any] | None = None  # (ray._private.worker, its print_to_stdstream)

    @property
    def started(self) -> bool:
        return self._fd is not None

    def start(self) -> DriverLog:
        if self.started:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            for name, fd in (("stdout", 1), ("stderr", 2)):
                self._keep_stream_on_terminal(name, fd)
                self._saved_fds[fd] = os.dup(fd)
                os.dup2(self._fd, fd)
        except OSError:  # no such descriptor (a daemon): nothing of it to route
            self.stop()
            raise
        self._take_loggers()
        return self

    def _keep_stream_on_terminal(self, name: str, fd: int) -> None:
        stream = getattr(sys, name)
        try:
            stream.flush()
            own = stream.fileno() == fd
        except (AttributeError, OSError, ValueError):
            own = False
        if own:
            ours = _Terminal(stream, fd)
            setattr(sys, name, ours)
            self._streams.append((name, stream, ours))

    def _take_loggers(self) -> None:
        """The ``ray`` logger and warnings write to the log (Ray's own handler writes to whatever
        ``sys.stderr`` is when a line comes: the terminal, now)."""
        assert self._fd is not None
        log: TextIO = io.TextIOWrapper(io.FileIO(os.dup(self._fd), "w", closefd=True), encoding="utf-8",
                               errors="replace", line_buffering=True, write_through=True)
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter(_FORMAT))
        ray_logger = logging.getLogger("ray")
        self._ray_handlers, self._ray_propagate = list(ray_logger.handlers), ray_logger.propagate
        for h in self._ray_handlers:
            ray_logger.removeHandler(h)
        ray_logger.addHandler(handler)
        ray_logger.propagate = False
        self._handler = handler
        self._showwarning = warnings.showwarning

        def to_log(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                   line: str | None = None) -> None:
            log.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = to_log
        self._take_error_messages(log)

    def _take_error_messages(self, log: TextIO) -> None:
        """The messages the cluster publishes to its drivers (a worker or a node died, with the tail of
        its raylet's log: ``(raylet) ... [state-dump] ...``) go to the log. Ray's driver prints them from
        a thread of its own to whatever ``sys.stdout`` is through ``print_to_stdstream``, a module global
        it looks up on each message: that function, for as long as this log runs, prints them with Ray's
        own formatting (``print_worker_logs``) to the log."""
        worker: Any = sys.modules.get("ray._private.worker")
        original = getattr(worker, "print_to_stdstream", None)
        print_logs = getattr(worker, "print_worker_logs", None)
        if worker is None or original is None or print_logs is None:
            return

        def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
            print_logs(data, log, ignore_prefix)

        worker.print_to_stdstream = to_log
        self._ray_print = (worker, original)

    def stop(self) -> None:
        if self._handler is not None:
            ray_logger = logging.getLogger("ray")
            ray_logger.removeHandler(self._handler)
            for h in self._ray_handlers:
                ray_logger.addHandler(h)
            ray_logger.propagate = self._ray_propagate
            self._handler.close()
            self._handler.stream.close()
            self._handler, self._ray_handlers = None, []
        if self._showwarning is not None:
            warnings.showwarning, self._showwarning = self._showwarning, None
        if self._ray_print is not None:
            worker, original = self._ray_print
            worker.print_to_stdstream = original
            self._ray_print = None
        for fd, saved in self._saved_fds.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved_fds = {}
        for name, stream, ours in reversed(self._streams):
            ours.release()
            if getattr(sys, name) is ours:
                setattr(sys, name, stream)
        self._streams = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DriverLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Terminal:
    """``sys.stdout`` or ``sys.stderr`` while a `DriverLog` runs: writes go to a
    copy of the descriptor the stream had (the terminal), and after `release`
    to the stream itself, so whoever kept a reference to this object (a live
    table that wrapped ``sys.stdout``, say) writes to the terminal either way."""

    def __init__(self, stream: TextIO, fd: int):
        self._stream = stream
        self._copy: TextIO | None = io.TextIOWrapper(
            io.FileIO(os.dup(fd), "w", closefd=True), encoding=stream.encoding, errors=stream.errors,
            line_buffering=True, write_through=True)
        self._target: TextIO = self._copy

    def write(self, text: str) -> int:
        return self._target.write(text)

    def flush(self) -> None:
        self._target.flush()

    def release(self) -> None:
        copy, self._copy = self._copy, None
        self._target = self._stream
        if copy is not None:
            copy.flush()
            copy.close()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the target's
        return getattr(self._target, name)
