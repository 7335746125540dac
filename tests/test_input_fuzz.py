"""Bad input never crashes or hangs: a property test over both problem schemas.

Hypothesis mutates the shipped example problems (every file of
``datasets/examples`` that is a problem) one to three times: a field replaced
by junk (non-finite numbers, huge or negative integers, wrong types, unicode,
empty and nested containers), a number scaled by up to 10^12 or negated, a key
deleted or an unknown key added. Each mutant is written as JSON or YAML and
run through the command line in this process (``thrifty solve FILE``): the
exit code must be 0 (a plan), 2 (bad input, one line naming the file) or 3
(infeasible), the output must hold no traceback, and each run must end within
`PER_RUN_S` seconds of this process's CPU time (a watchdog stops a hang; CPU
time, not wall time, which a loaded host stretches several-fold: under a load
of 10 on 2 cores, solves of 2 s took over 10 s and failed the test; a hang
that sleeps is stopped by the wall-clock backstop `WALL_S`). The same document goes through the
Python API, ``solve(dict)``, which must return a plan or raise a
`ThriftyError`. Raw files (arbitrary bytes, truncated or deeply nested text)
go through the command line too.

Each test counts the examples it ran and asserts the count, so a change of
Hypothesis settings cannot silently shrink the test (the issue asks for
1,000+ files over both schemas). The mutants of a schema are drawn in
`SHARDS` tests of their own fixed seeds (``RUNS[kind] / SHARDS`` each, the
same total), so parallel workers share them; a seed is fixed, not drawn,
so a failure reproduces.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from thrifty.core.errors import ThriftyError
from thrifty.runtime.cli import main as cli_main
from thrifty.solver import solve

EXAMPLES = Path(__file__).resolve().parents[1] / "datasets" / "examples"
# CPU seconds (all threads) for one run: a hang, not a slow answer. The slowest mutants (an infeasible problem
# whose explanation searches a large space) take about 5 s alone, and CPU time itself grows when more processes
# than cores share the host (caches, CP-SAT's two threads)
PER_RUN_S = 20.0
WALL_S = 120.0  # the same run in wall-clock seconds, however loaded the host
OK_CODES = (0, 2, 3)
# 1,010 mutants over the two schemas (the issue asks for 1,000+); a tuning mutant that solves costs a worker
# about 0.3 s (the planner simulates the whole tuning job, by the API and by the command line), a training one
# about a sixth of that, so the tuning share is the smaller (it was 450 of 1,100, 40% of the module's time)
RUNS = {"training": 650, "tuning": 360, "raw": 150}
SHARDS = 4  # tests per schema, each with its own seed and RUNS[kind] // SHARDS mutants (short tests, so that
# the parallel workers end together instead of one finishing a long shard alone)


def fuzz_settings(examples: int, *, derandomize: bool = True) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


def _absolute(doc: dict[str, Any]) -> dict[str, Any]:
    """The example with its relative file references made absolute, so the
    mutant can live anywhere (a problem's paths resolve against its folder)."""
    out = dict(doc)
    for key in ("catalog", "allreduce", "model"):
        value = out.get(key)
        if isinstance(value, str) and (EXAMPLES / value).is_file():
            out[key] = str((EXAMPLES / value).resolve())
    return out


def _bases(kind: str) -> list[dict[str, Any]]:
    docs = [json.loads(p.read_text()) for p in sorted(EXAMPLES.glob("*.json"))]
    return [_absolute(d) for d in docs if isinstance(d, dict) and d.get("kind") == kind]


JUNK = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 1e30, 10**30, 10**400, -(10**30), 2**63,
                     2**64 + 1, -1, 0, -0.0, 0.5, 1e-300, True, False, None, "", "é", "\u0000", "\U0001F600" * 3,
                     "\ud800", "on_demand", "spot", "min_time", [], {}, [[[[[]]]]], {"a": {"b": None}},
                     [0], [1, 2, 3], [-1], [10**30]]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=10**6), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)
SCALES = st.sampled_from([0, -1, 1e-12, 1e-3, 0.5, 2, 10, 1000, 10**6, 10**12])


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every location in `doc`: keys of dicts and indices of lists, nested."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


@st.composite
def mutants(draw, bases: list[dict[str, Any]]) -> dict[str, Any] | Any:
    doc: Any = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["junk", "scale", "scale", "scale", "delete", "add"]))
        paths = _paths(doc)
        if op == "scale":  # half the mutants keep every type right: extreme but valid-looking values
            paths = [p for p in paths if isinstance(_get(doc, p), (int, float)) and not isinstance(_get(doc, p), bool)]
            if not paths:
                continue
        path = draw(st.sampled_from(paths))
        if not path:  # the whole document
            if op == "junk":
                return copy.deepcopy(draw(JUNK))
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        value = parent[key]
        if op == "junk":
            parent[key] = copy.deepcopy(draw(JUNK))
        elif op == "scale":
            scale = draw(SCALES)
            try:
                scaled = value * scale
                finite = math.isfinite(scaled)
            except OverflowError:  # an int past a float's range, scaled again: an infinity of its sign
                scaled, finite = (math.inf if (value > 0) == (scale > 0) else -math.inf), False
            parent[key] = int(scaled) if isinstance(value, int) and finite else scaled
        elif op == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = copy.deepcopy(draw(JUNK))
        else:
            parent.append(copy.deepcopy(draw(JUNK)))
    return doc


def _text(doc: Any, as_yaml: bool) -> tuple[str, str]:
    """(file suffix, text): YAML when asked and representable, else JSON (with
    NaN and Infinity, which Python's JSON reader accepts)."""
    if as_yaml:
        try:
            return ".yaml", yaml.safe_dump(doc, allow_unicode=True)
        except (yaml.YAMLError, UnicodeEncodeError, ValueError):
            pass
    return ".json", json.dumps(doc)


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _watchdog(cpu_s: float, wall_s: float = WALL_S):
    """Raise `_Hang` in this (main) thread after `cpu_s` seconds of this
    process's CPU time (``ITIMER_PROF``) or `wall_s` of wall-clock time,
    whichever comes first: a hang fails the test."""
    def fire(signum, frame):
        kind = "CPU" if signum == signal.SIGPROF else "wall-clock"
        raise _Hang(f"still running after {cpu_s if kind == 'CPU' else wall_s} s of {kind} time")

    timers = ((signal.SIGPROF, signal.ITIMER_PROF, cpu_s), (signal.SIGALRM, signal.ITIMER_REAL, wall_s))
    previous = {signum: signal.signal(signum, fire) for signum, _, _ in timers}
    for _, timer, seconds in timers:
        signal.setitimer(timer, seconds)
    try:
        yield
    finally:
        for signum, timer, _ in timers:
            signal.setitimer(timer, 0)
            signal.signal(signum, previous[signum])


def _run_cli(path: Path) -> tuple[int, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    with _watchdog(PER_RUN_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(["solve", str(path)])
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue() + err.getvalue(), time.process_time() - start


def _check_cli(path: Path, what: str) -> tuple[int, float]:
    code, output, seconds = _run_cli(path)
    assert code in OK_CODES, f"{what}: exit {code}\n{output[-2000:]}"
    assert "Traceback" not in output, f"{what}:\n{output[-2000:]}"
    if code == 2:
        assert output.strip().count("\n") == 0 and "error:" in output, f"{what}: not one clear line:\n{output}"
    assert seconds < PER_RUN_S, f"{what}: {seconds:.1f} s of CPU time"
    return code, seconds


def _check_api(doc: Any, what: str) -> None:
    with _watchdog(PER_RUN_S):
        try:
            solve(doc)
        except ThriftyError:
            pass
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{what}: solve() raised {type(e).__name__}: {e}")


@pytest.mark.parametrize("shard", range(SHARDS))
@pytest.mark.parametrize("kind", ["training", "tuning"])
def test_mutated_problems_exit_cleanly(kind: str, shard: int, tmp_path: Path) -> None:
    ran, codes, slowest = [], {0: 0, 2: 0, 3: 0}, [0.0]
    runs = RUNS[kind] // SHARDS

    @seed(shard)
    @fuzz_settings(runs, derandomize=False)
    @given(doc=mutants(_bases(kind)), as_yaml=st.booleans())
    def check(doc: Any, as_yaml: bool) -> None:
        suffix, text = _text(doc, as_yaml)
        path = tmp_path / f"problem{suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        what = f"{kind} mutant {text[:300]!r}"
        code, seconds = _check_cli(path, what)
        codes[code] += 1
        slowest[0] = max(slowest[0], seconds)
        _check_api(doc, what)
        ran.append(suffix)

    check()
    print(f"{kind} shard {shard}: {len(ran)} mutants ({ran.count('.yaml')} YAML), exit codes {codes}, "
          f"slowest {slowest[0]:.2f} s")
    assert len(ran) >= runs * 0.95  # hypothesis may stop a little short of max_examples


@pytest.mark.parametrize("kind", ["raw"])
def test_raw_files_exit_cleanly(kind: str, tmp_path: Path) -> None:
    ran = []
    example = (EXAMPLES / "srifty-case1-resnet50.json").read_bytes()
    raw = st.one_of(
        st.binary(max_size=64),
        st.integers(0, len(example)).map(lambda n: example[:n]),
        st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.just(b"\xef\xbb\xbf" + example),  # a byte-order mark
        st.just("kind: training\nglobal_batch: [\n".encode()),
    )

    @fuzz_settings(RUNS[kind])
    @given(data=raw, suffix=st.sampled_from([".json", ".yaml", ".yml", ".txt"]))
    def check(data: bytes, suffix: str) -> None:
        path = tmp_path / f"problem{suffix}"
        path.write_bytes(data)
        _check_cli(path, f"raw {suffix} file {data[:200]!r}")
        ran.append(suffix)

    check()
    print(f"raw: {len(ran)} files")
    assert len(ran) >= RUNS[kind] * 0.95


def test_a_problem_path_with_a_nul_byte_is_a_clear_error():
    from thrifty.core.errors import ProblemError

    with pytest.raises(ProblemError, match="NUL byte"):
        solve("problem\x00.json")
