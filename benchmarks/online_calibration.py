"""Online calibration in ``thrifty run`` on the README demo, with and without a CPU hog beside it (issue 36).

The README's demo (``datasets/examples/local-demo-srifty54.json``: 600
iterations of the tiny transformer on two local pseudo machines, a 30 s
limit and a $0.05 budget) is run with ``thrifty run`` as a user runs it
(a fresh process, ``--no-progress``), once as it is and once with its time
limit raised to 90 s, each without and with a hog: N busy processes
(``python -c 'while True: pass'``, N = the host's CPUs by default) started
by this script before the run and killed at its end. From each run's log
(``run.jsonl``):

- the prediction error before and after the first calibrated window:
  ``|predicted - measured| / measured`` of the iteration time, where
  *measured* is the mean iteration time of the first segment's later
  windows (every window after the first: the first corrected prediction
  has not seen them), *before* is the plan's prediction (the prior
  profile) and *after* the corrected models' prediction made at the end
  of the first window;
- whether the run ended within its limits (exit code, elapsed time);
- when infeasibility was first reported (the ``infeasible_forecast``
  event: its window and the seconds since the start), next to the window
  length; "never" when no window showed it.

Printed as one table per time limit, the runs without and with the hog side
by side, with the host's load average before and after each run (the host
may be shared: other processes count). Run:
``python benchmarks/online_calibration.py [--hog N] [--limits 30,90] [--keep DIR]``;
a limit ``SECONDS:USD`` also sets the budget (a host so busy that the demo
takes minutes needs a budget past the demo's $0.05 for a run that can meet
its limits).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
ZOO = "thrifty.runtime.training.examples:zoo"
RUN_TIMEOUT_S = 900
console = Console(width=160)


def start_hog(n: int) -> list[subprocess.Popen]:
    """N busy processes, one loop each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_hog(hog: list[subprocess.Popen]) -> None:
    for p in hog:
        p.kill()
    for p in hog:
        p.wait()


def problem_with_limit(time_s: float, folder: Path, cost_usd: float | None = None) -> Path:
    """The demo problem with its time limit set to `time_s` (and its budget to
    `cost_usd` when given; its catalog named by absolute path)."""
    data = json.loads(DEMO.read_text())
    data["limits"]["time_s"] = time_s
    if cost_usd is not None:
        data["limits"]["cost_usd"] = cost_usd
    data["catalog"] = str(DEMO.parent / data["catalog"])
    data["name"] = f"{data['name']} (time limit {time_s:g} s, budget ${data['limits']['cost_usd']:g})"
    path = folder / f"demo-{time_s:g}s-{data['limits']['cost_usd']:g}usd.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def run_demo(problem: Path, out: Path, hog: int) -> dict[str, Any]:
    """One ``thrifty run`` of `problem` beside `hog` busy processes; what its log says."""
    processes = start_hog(hog)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "run", str(problem), "--trainer", ZOO,
                               "--out", str(out), "--no-progress"], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
    finally:
        stop_hog(processes)
    wall = time.perf_counter() - started
    events = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines() if line.strip()]
    return {"exit": done.returncode, "wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()[0],
            "stderr": done.stderr, **summarize(events)}


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of the tables from one run log (see the module docstring)."""
    start = next(e for e in events if e["event"] == "start")
    finish = next((e for e in events if e["event"] == "finish"), None)
    windows = [e for e in events if e["event"] == "calibration" and e["segment"] == 0]
    forecast = next((e for e in events if e["event"] == "infeasible_forecast"), None)
    later = [e["measured"]["iteration_s"] for e in windows[1:] if e["measured"]["iteration_s"]]
    measured = statistics.fmean(later) if later else None
    prior = start["plan"]["predicted"]["iteration_s"]
    first = windows[0]["corrected"]["iteration_s"] if windows else None
    return {
        "window_s": start.get("window_s"), "windows": len(windows), "measured_iteration_s": measured,
        "prior_iteration_s": prior, "corrected_iteration_s": first,
        "error_before": None if measured is None else abs(prior - measured) / measured,
        "error_after": None if measured is None or first is None else abs(first - measured) / measured,
        "assumed": windows[0]["assumed"] if windows else None,
        "within_limits": None if finish is None else finish["within_limits"],
        "elapsed_s": None if finish is None else finish["elapsed_s"],
        "time_limit_s": start["limits"].get("time_s"),
        "infeasible_window": None if forecast is None else forecast["window"],
        "infeasible_at_s": None if forecast is None else forecast["elapsed_s"],
        "least_change": None if forecast is None else forecast["relaxations"][:2],
        "first_window_at_s": windows[0]["elapsed_s"] if windows else None,
    }


def _pct(value: float | None) -> str:
    return "--" if value is None else f"{value * 100:.1f}%"


def _ms(value: float | None) -> str:
    return "--" if value is None else f"{value * 1e3:.1f} ms"


def table(limit: str, runs: dict[str, dict[str, Any]]) -> Table:
    t = Table(title=f"README demo, {limit}: without and with a CPU hog")
    t.add_column("")
    for name in runs:
        t.add_column(name, justify="right")
    rows = [
        ("load average (1 min) before / after", lambda r: f"{r['load_before']:.1f} / {r['load_after']:.1f}"),
        ("window (s) / windows in segment 0", lambda r: f"{r['window_s']:.2f} / {r['windows']}"),
        ("iteration measured (windows 2..)", lambda r: _ms(r["measured_iteration_s"])),
        ("prior prediction (plan)", lambda r: _ms(r["prior_iteration_s"])),
        ("corrected after window 1", lambda r: _ms(r["corrected_iteration_s"])),
        ("prediction error before window 1", lambda r: _pct(r["error_before"])),
        ("prediction error after window 1", lambda r: _pct(r["error_after"])),
        ("exit code", lambda r: str(r["exit"])),
        ("ended within its limits", lambda r: f"{r['within_limits']} ({r['elapsed_s']:.1f} s)"
         if r["elapsed_s"] is not None else "--"),
        ("infeasibility first reported", lambda r: "never" if r["infeasible_window"] is None else
         f"window {r['infeasible_window']}, {r['infeasible_at_s']:.1f} s"),
        ("first window closed at", lambda r: "--" if r["first_window_at_s"] is None
         else f"{r['first_window_at_s']:.1f} s"),
    ]
    for label, cell in rows:
        t.add_row(label, *(cell(r) for r in runs.values()))
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hog", type=int, default=os.cpu_count() or 2, help="busy processes beside the hogged runs")
    parser.add_argument("--limits", default="30,90",
                        help="limits to run the demo with, comma-separated: SECONDS or SECONDS:USD (the budget; "
                             "default the demo's $0.05)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the hog and the run are stopped on the way out
    pairs = (x.partition(":") for x in args.limits.split(","))
    limits = [(float(t), float(usd) if usd else None) for t, _, usd in pairs]
    folder = args.keep or Path(tempfile.mkdtemp(prefix="thrifty-online-calibration-"))
    folder.mkdir(parents=True, exist_ok=True)
    console.print(f"{os.cpu_count()} CPUs; hog: {args.hog} busy processes; runs in {folder}")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for time_s, usd in limits:
        problem = problem_with_limit(time_s, folder, usd)
        label = f"time limit {time_s:g} s" + (f", budget ${usd:g}" if usd is not None else "")
        results[label] = {}
        for name, hog in (("without hog", 0), (f"with hog ({args.hog} procs)", args.hog)):
            out = folder / f"run-{problem.stem}-hog{hog}"
            results[label][name] = r = run_demo(problem, out, hog)
            console.print(f"{label}, {name}: exit {r['exit']}, {r['wall_s']:.0f} s wall; {r['assumed']}")
            if r["least_change"]:
                console.print(f"  least change said: {r['least_change']}")
    for limit, runs in results.items():
        console.print(table(limit, runs))


if __name__ == "__main__":
    main()
