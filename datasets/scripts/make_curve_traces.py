"""Measure learning-curve traces: train small models over random
hyperparameter configurations and record, per epoch, the validation accuracy
and the wall time (HyperDrive 7.1: the trace generator whose recorded curves
and iteration times the trace-driven simulator replays). Two tasks:

- ``digits-mlp``: MLPs on scikit-learn's bundled 8x8 digits (the tuning
  example's model, `thrifty.runtime.tuning.examples`). Curves bunch near
  their ceiling (0.95-0.988).
- ``noisy-digits-cnn``: a small CNN (two 3x3 convolutions, max pooling, a
  linear layer) on a harder image task this script generates from the same
  digits: every image shifted by up to one pixel in each direction and
  covered with Gaussian pixel noise (sd `NOISY_DIGITS_NOISE`), two corrupted
  copies of each image, the split made before corrupting so that no
  validation image is a copy of a training one. Accuracy tops out near 0.8,
  far from the bound 1; slow configurations separate late.

Everything runs on one CPU thread (``torch.set_num_threads(1)``) with a fixed
seed; the digits data ship inside scikit-learn, nothing is downloaded.

    python3 datasets/scripts/make_curve_traces.py --task digits-mlp --configs 150 --epochs 50 --seed 0 \
        --out datasets/curve_traces/digits-mlp.json
    python3 datasets/scripts/make_curve_traces.py --task noisy-digits-cnn --configs 120 --epochs 50 --seed 0 \
        --out datasets/curve_traces/noisy-digits-cnn.json

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


TASKS = ("digits-mlp", "noisy-digits-cnn")
NOISY_DIGITS_NOISE = 0.3  # sd of the pixel noise (pixels in [0, 1]); accuracy then tops out near 0.8
NOISY_DIGITS_COPIES = 2  # corrupted copies of every image


def sample_config(rng: np.random.Generator, task: str = "digits-mlp") -> dict[str, Any]:
    """One random hyperparameter configuration (log-uniform scales where it matters)."""
    optimizer = str(rng.choice(OPTIMIZERS))
    lo, hi = LR_LOG10_RANGE[optimizer]
    config: dict[str, Any] = {"optimizer": optimizer, "learning_rate": float(10 ** rng.uniform(lo, hi))}
    if task == "digits-mlp":
        config |= {"width": int(rng.choice([16, 32, 64, 128, 256])), "depth": int(rng.integers(1, 5))}
    else:
        config["channels"] = int(rng.choice([4, 8, 12, 16]))
    config["weight_decay"] = float(10 ** rng.uniform(-6.0, -1.5))
    config["batch_size"] = int(rng.choice([16, 32, 64, 128, 256] if task == "digits-mlp" else [32, 64, 128, 256]))
    return config


def load_split(seed: int, task: str = "digits-mlp") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and validation arrays of the task (stratified split, fixed seed)."""
    from thrifty.runtime.tuning.examples import digits_split

    x_train, x_val, y_train, y_val = digits_split(seed)
    if task == "digits-mlp":
        return x_train, x_val, y_train, y_val
    rng = np.random.default_rng(seed)
    return (corrupt(x_train, rng), corrupt(x_val, rng),
            np.tile(y_train, NOISY_DIGITS_COPIES), np.tile(y_val, NOISY_DIGITS_COPIES))


def corrupt(flat: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`NOISY_DIGITS_COPIES` corrupted copies of 8x8 images given as rows of 64
    pixels: each shifted by -1, 0 or 1 pixel per axis (zeros shifted in) and
    covered with N(0, NOISY_DIGITS_NOISE^2) noise; shape (copies * n, 1, 8, 8)."""
    images = flat.reshape(-1, 8, 8)
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
    copies = []
    for _ in range(NOISY_DIGITS_COPIES):
        dx, dy = rng.integers(0, 3, len(images)), rng.integers(0, 3, len(images))
        shifted = np.stack([padded[i, dy[i]:dy[i] + 8, dx[i]:dx[i] + 8] for i in range(len(images))])
        copies.append(shifted + rng.normal(0.0, NOISY_DIGITS_NOISE, shifted.shape))
    return np.concatenate(copies)[:, None].astype(np.float32)


def build_model(config: dict[str, Any], n_in: int, n_out: int):
    """digits-mlp: the tuning example's MLP (`thrifty.runtime.tuning.examples.build_mlp`), so
    traces and trials agree; noisy-digits-cnn: `build_cnn`."""
    if "channels" in config:
        return build_cnn(config["channels"], n_out)
    from thrifty.runtime.tuning.examples import build_mlp

    return build_mlp(config["width"], config["depth"], n_in, n_out)


def build_cnn(channels: int, n_out: int):
    """conv 3x3 (channels) - ReLU - conv 3x3 (2 channels) - ReLU - max pool 2 - linear, on 1x8x8 images."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(1, channels, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(channels, 2 * channels, 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(2 * channels * 16, n_out),
    )


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
    parser.add_argument("--task", choices=TASKS, default="digits-mlp")
    parser.add_argument("--configs", type=int, default=120)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("datasets/curve_traces/digits-mlp.json"))
    args = parser.parse_args(argv)

    import sklearn
    import torch

    from thrifty.core.io import write_json

    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    data = load_split(args.seed, args.task)
    started = time.perf_counter()
    traces = []
    for i in range(args.configs):
        config = sample_config(rng, args.task)
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
            "task": args.task,
            "dataset": {
                "name": "sklearn.datasets.load_digits" + ("" if args.task == "digits-mlp" else (
                    f", each image shifted by up to 1 pixel per axis with N(0, {NOISY_DIGITS_NOISE}^2) pixel "
                    f"noise, {NOISY_DIGITS_COPIES} corrupted copies per image")),
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
