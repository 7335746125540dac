"""Measure learning-curve traces: train small MLPs on scikit-learn's bundled
digits dataset over random hyperparameter configurations and record, per epoch,
the validation accuracy and the wall time (HyperDrive 7.1: the trace generator
whose recorded curves and iteration times the trace-driven simulator replays).

Everything runs on one CPU thread (``torch.set_num_threads(1)``) with a fixed
seed; the digits data ship inside scikit-learn, nothing is downloaded.

    python3 datasets/scripts/make_curve_traces.py --configs 120 --epochs 40 --seed 0 \
        --out datasets/curve_traces/digits-mlp.json

The output (format ``thrifty.curve_traces/1``) is read by
``thrifty.datasets.curves.load_traces``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.runtime.tuning.examples import OPTIMIZERS  # the tuning example's optimizers

FORMAT = "thrifty.curve_traces/1"
# log10 learning-rate range per optimizer: wide enough that some runs crawl and some diverge
LR_LOG10_RANGE = {"sgd": (-3.0, 0.0), "momentum": (-3.5, -0.5), "adam": (-4.5, -1.0), "rmsprop": (-4.5, -1.0)}


def sample_config(rng: np.random.Generator) -> dict[str, Any]:
    """One random hyperparameter configuration (log-uniform scales where it matters)."""
    optimizer = str(rng.choice(OPTIMIZERS))
    lo, hi = LR_LOG10_RANGE[optimizer]
    return {
        "optimizer": optimizer,
        "learning_rate": float(10 ** rng.uniform(lo, hi)),
        "width": int(rng.choice([16, 32, 64, 128, 256])),
        "depth": int(rng.integers(1, 5)),
        "weight_decay": float(10 ** rng.uniform(-6.0, -1.5)),
        "batch_size": int(rng.choice([16, 32, 64, 128, 256])),
    }


def load_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits features scaled to [0, 1], split into train and validation (stratified, fixed seed)."""
    from thrifty.runtime.tuning.examples import digits_split

    return digits_split(seed)


def build_model(config: dict[str, Any], n_in: int, n_out: int):
    """The tuning example's MLP (`thrifty.runtime.tuning.examples.build_mlp`), so traces and trials agree."""
    from thrifty.runtime.tuning.examples import build_mlp

    return build_mlp(config["width"], config["depth"], n_in, n_out)


def build_optimizer(config: dict[str, Any], params):
    from thrifty.runtime.tuning.examples import build_optimizer as optimizer_for

    return optimizer_for(config["optimizer"], params, config["learning_rate"], config["weight_decay"])


def train_one(config: dict[str, Any], data, epochs: int, seed: int) -> tuple[list[float], list[float]]:
    """Train one configuration; per epoch: validation accuracy and wall seconds
    (one pass over the shuffled training set plus the validation pass)."""
    import torch

    x_train, x_val, y_train, y_val = (torch.from_numpy(a) for a in data)
    torch.manual_seed(seed)
    model = build_model(config, x_train.shape[1], 10)
    optimizer = build_optimizer(config, model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    batch = config["batch_size"]
    accuracy, epoch_s = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(x_train))
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            optimizer.zero_grad()
            loss_fn(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            # a diverged run (NaN/inf logits) is recorded as what it is: no better than a constant guess
            logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
            correct = (logits.argmax(dim=1) == y_val).sum().item()
        epoch_s.append(time.perf_counter() - start)
        accuracy.append(correct / len(y_val))
    return accuracy, epoch_s


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=int, default=120)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("datasets/curve_traces/digits-mlp.json"))
    args = parser.parse_args(argv)

    import sklearn
    import torch

    from thrifty.datasets.io import write_json

    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    data = load_split(args.seed)
    started = time.perf_counter()
    traces = []
    for i in range(args.configs):
        config = sample_config(rng)
        accuracy, epoch_s = train_one(config, data, args.epochs, seed=args.seed * 100_003 + i)
        traces.append(
            {
                "config": config,
                "accuracy": [round(a, 6) for a in accuracy],
                "epoch_s": [float(f"{s:.4g}") for s in epoch_s],
            }
        )
        print(
            f"[{i + 1}/{args.configs}] {config} final acc {accuracy[-1]:.4f} "
            f"({sum(epoch_s):.1f} s)",
            flush=True,
        )
    total_s = time.perf_counter() - started
    command = "python3 datasets/scripts/make_curve_traces.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
    )
    write_json(
        args.out,
        {
            "format": FORMAT,
            "kind": "measured",
            "name": args.out.stem,
            "command": command,
            "date": datetime.date.today().isoformat(),
            "machine": {
                "cpu": cpu_model(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "sklearn": sklearn.__version__,
                "python": platform.python_version(),
            },
            "dataset": {
                "name": "sklearn.datasets.load_digits",
                "train": int(len(data[0])),
                "validation": int(len(data[1])),
            },
            "epochs": args.epochs,
            "generation_s": round(total_s, 1),
            "traces": traces,
        },
    )
    print(f"wrote {len(traces)} traces to {args.out} in {total_s:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
