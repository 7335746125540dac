"""``thrifty fit-allreduce PROBES.csv [...] --out MODEL.json``: fit the
learned allreduce model of Srifty 4.2 (two XGBoost submodels, at or below and
above the MTU) on probe CSVs, print the held-out MAPE of each submodel, and
save the model atomically (nothing is written when any input is bad).

The model's provenance records this command (every setting spelled out) and
the sha256 of each input, so the file can be regenerated from the probes.
"""

from __future__ import annotations

import argparse
import shlex
from datetime import datetime, timezone

from thrifty.runtime.commands._args import int_at_least, output_file, positive_float, with_exit_codes

HELP = "fit the learned allreduce (bus bandwidth) model on probe CSVs and save it"

__all__ = ["HELP", "add_arguments", "run", "command_line"]


def _fraction(text: str) -> float:
    value = positive_float(text)
    if not value < 0.5:
        raise argparse.ArgumentTypeError(f"{text} must be below 0.5")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "the model was written"})
    parser.add_argument("probes", nargs="+", metavar="PROBES.csv", help="probe files from thrifty probe-allreduce")
    parser.add_argument("--out", required=True, type=output_file, metavar="MODEL.json", help="where to write the model")
    parser.add_argument(
        "--half-life-days", type=positive_float, metavar="D",
        help="decay the weight of a probe by half every D days of age (default: no decay)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split and of xgboost (default 0)")
    parser.add_argument(
        "--holdout", type=_fraction, default=0.2, metavar="F",
        help="fraction of (type, world size, buffer) groups held out as the test set (default 0.2)",
    )
    parser.add_argument(
        "--mape-weights", action="store_true",
        help="also try MAPE-leaning row weights in selection (lower MAPE on noisy probes, "
        "but predicts the slow repeats of a configuration rather than its median)",
    )
    parser.add_argument(
        "--per-repeat", action="store_true",
        help="fit every repeat as its own row, as Srifty does (default: pool each cell's repeats into the "
        "busbw of their mean time, so the model predicts mean transfer times)",
    )
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="xgboost threads (default 1)")


def command_line(args: argparse.Namespace) -> str:
    words = ["thrifty", "fit-allreduce", *args.probes, "--out", args.out]
    if args.half_life_days is not None:
        words += ["--half-life-days", str(args.half_life_days)]
    words += ["--seed", str(args.seed), "--holdout", str(args.holdout)]
    if args.mape_weights:
        words.append("--mape-weights")
    if args.per_repeat:
        words.append("--per-repeat")
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    from thrifty.perfmodels.allreduce import DEFAULT_GRID, MAPE_WEIGHTED_GRID, file_digest, fit_allreduce, load_probes

    table = load_probes(args.probes)
    provenance = {
        "kind": "derived",
        "script": command_line(args),
        "inputs": [{"path": p, "digest": file_digest(p)} for p in args.probes],
        "date": datetime.now(timezone.utc).date().isoformat(),
    }
    model = fit_allreduce(
        table,
        half_life_days=args.half_life_days,
        seed=args.seed,
        holdout_fraction=args.holdout,
        grid=MAPE_WEIGHTED_GRID if args.mape_weights else DEFAULT_GRID,
        nthread=args.threads,
        provenance=provenance,
        pool=not args.per_repeat,
    )
    model.save(args.out)
    _print_report(model, args.out)
    return 0


def describe(h) -> str:
    """``pseudohubererror, log_time, depth 3, 300 x 0.05, 1/busbw weights``."""
    text = (f"{h.objective.removeprefix('reg:')}, {h.target}, depth {h.max_depth}, "
            f"{h.n_estimators} x {h.learning_rate:g}")
    return text + (", 1/busbw weights" if h.relative_weights else "")


def _print_report(model, out: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    pooled = bool(model.training.get("pooled"))
    what = "cell means" if pooled else "rows"
    table = Table(title=f"bus bandwidth MAPE on {what} (held-out: whole (world size, buffer) groups never trained on)")
    columns = ["submodel", what, "groups", "cv", "held-out"] + ([] if pooled else ["vs medians", "noise floor"])
    for column in columns:
        table.add_column(column, justify="left" if column == "submodel" else "right")
    for name, r in model.fit_report.items():
        cells = [f"{name} ({r.regime.replace('buffer_bytes', 'bytes')})", str(r.rows), str(r.groups),
                 f"{r.cv_mape:.1%}", f"{r.heldout_mape:.1%}"]
        if not pooled:
            cells += [f"{r.heldout_median_mape:.1%}", f"{r.noise_floor_mape:.1%}"]
        table.add_row(*cells)
    console.print(table)
    if pooled:
        console.print(
            f"the {model.training['rows']} probe rows were pooled into the mean time of each cell (type, world size, "
            "buffer, concurrency); cv: out-of-fold MAPE of the chosen candidate; held-out: MAPE on the test "
            "groups' cells"
        )
    else:
        console.print(
            "cv: out-of-fold MAPE of the chosen candidate; held-out: MAPE on the test groups' rows; "
            "vs medians: the same predictions against each test cell's median over repeats; "
            "noise floor: the least MAPE any model can reach on those rows (repeats disagree)"
        )
    for name, r in model.fit_report.items():
        console.print(f"{name}: chose {describe(r.hyperparams)} of {r.candidates} candidates ({r.folds}-fold cv)")
    types = ", ".join(f"{c.name} (world sizes {', '.join(map(str, c.world_sizes))})" for c in model.coverage.values())
    console.print(f"covers: {types}; other types fall back to the shipped derived cloud model (GPU types) "
                  "and the analytic ring model (the rest)")
    console.print(f"wrote {out}")
