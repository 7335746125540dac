"""Ready trainers for tuning examples: the digits MLP (``thrifty tune
datasets/examples/tune-digits.json``).

`digits_mlp` is the model and optimizer of the measured learning-curve
traces (``datasets/scripts/make_curve_traces.py``, which builds its models
with `build_mlp` and `build_optimizer` from here): an MLP of `depth` ReLU
layers of `width` units on scikit-learn's bundled 8x8 digits (features
scaled to [0, 1], a stratified third held out for validation, nothing
downloaded), trained with one of SGD, SGD with momentum 0.9, Adam or
RMSprop. One iteration is one epoch; the metric is validation accuracy.
"""

from __future__ import annotations

from typing import Any

from thrifty.runtime.ddp.trainer import TunableTrainer

__all__ = ["digits_mlp", "digits_split", "build_mlp", "build_optimizer", "OPTIMIZERS"]

OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")
VALIDATION_FRACTION = 1 / 3


def digits_split(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """Digits features scaled to [0, 1]; train and validation (stratified, fixed seed), as numpy arrays."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=VALIDATION_FRACTION, random_state=seed, stratify=y)
    return x_train, x_val, y_train, y_val


def build_mlp(width: int, depth: int, n_in: int, n_out: int) -> Any:
    import torch

    layers: list[torch.nn.Module] = []
    width_in = n_in
    for _ in range(depth):
        layers += [torch.nn.Linear(width_in, width), torch.nn.ReLU()]
        width_in = width
    layers.append(torch.nn.Linear(width_in, n_out))
    return torch.nn.Sequential(*layers)


def build_optimizer(name: str, params: Any, learning_rate: float, weight_decay: float) -> Any:
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, weight_decay=weight_decay)
    if name == "momentum":
        return torch.optim.SGD(params, lr=learning_rate, momentum=0.9, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=learning_rate, weight_decay=weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=learning_rate, weight_decay=weight_decay)
    raise ValueError(f"optimizer is '{name}', but must be one of {', '.join(OPTIMIZERS)}")


def digits_mlp(learning_rate: float = 0.01, width: int = 64, depth: int = 2, optimizer: str = "adam",
               weight_decay: float = 1e-5, batch_size: int = 64, seed: int = 0) -> TunableTrainer:
    """The digits MLP as a tuning trial (see the module docstring);
    ``thrifty.runtime.tuning.examples:digits_mlp``."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer is '{optimizer}', but must be one of {', '.join(OPTIMIZERS)}")
    x_train, x_val, y_train, y_val = digits_split(seed)

    def model() -> Any:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build_mlp(int(width), int(depth), x_train.shape[1], 10)

    def dataset() -> Any:
        import torch
        from torch.utils.data import TensorDataset

        return TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))

    def loss(outputs: Any, targets: Any) -> Any:
        import torch.nn.functional as F

        return F.cross_entropy(outputs, targets)

    def metric(net: Any) -> float:
        import torch

        with torch.no_grad():
            logits = torch.nan_to_num(net(torch.from_numpy(x_val)), nan=0.0, posinf=0.0, neginf=0.0)
            return float((logits.argmax(dim=1) == torch.from_numpy(y_val)).float().mean())

    return TunableTrainer(model=model, dataset=dataset, loss=loss, metric=metric, batch_size=int(batch_size),
                          optimizer=lambda p: build_optimizer(optimizer, p, float(learning_rate),
                                                              float(weight_decay)),
                          steps_per_iteration=None)
