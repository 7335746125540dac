"""A user's own training loop, written for thrifty as a user writes one: a
small CNN on synthetic images, with a OneCycle learning-rate schedule, bf16
autocast, gradient clipping, gradient accumulation and an evaluation on
held-out images at each epoch's end.

``train(ctx, **args)`` is a loop function, the job contract of
``thrifty.runtime.ddp.context``: the runtime calls it once per rank with the
context ``ctx``, which gives the rank's share of the plan (``ctx.local_batch``,
``ctx.global_batch``, ``ctx.iterations``, ``ctx.device``) and takes back the
model (``ctx.prepare_model``), the data (``ctx.prepare_loader``), the metrics
and the state to checkpoint (``ctx.report``); ``ctx.restore()`` gives the
state back after a preemption or a re-plan. The same file, unchanged, is what
``thrifty profile``, ``thrifty run`` and ``thrifty tune`` take
(``datasets/examples/cnn/train.py:train``); its keyword arguments, all
defaulted, are the job's arguments and a tuning search's space.

The data is synthetic and derived, made here from ``seed`` alone (nothing is
downloaded or shipped): each class is a random image (its template), and a
sample is its class's template shifted by up to two pixels, plus Gaussian
noise. The first ``samples`` images train, the next ``held_out`` evaluate.

The model has no batch normalisation and no dropout: both would make a
rank's update depend on how the plan splits the global batch, and thrifty
keeps heterogeneous batches the single-device mathematics (a normalisation a
user needs is GroupNorm or LayerNorm).

This file imports torch and nothing of thrifty.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def synthetic_images(count: int, classes: int = 10, size: int = 16, channels: int = 3,
                     seed: int = 0) -> TensorDataset:
    """`count` images (``channels x size x size``, float32) and labels: each
    its class's template (drawn from `seed`) rolled by up to two pixels in
    each direction, plus noise of standard deviation 0.5."""
    generator = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, channels, size, size, generator=generator)
    labels = torch.randint(classes, (count,), generator=generator)
    shifts = torch.randint(-2, 3, (count, 2), generator=generator)
    rows = (torch.arange(size)[None, :] - shifts[:, :1]) % size  # sample i's row r comes from row r - shift
    cols = (torch.arange(size)[None, :] - shifts[:, 1:]) % size
    images = templates[labels][torch.arange(count)[:, None, None, None], torch.arange(channels)[None, :, None, None],
                               rows[:, None, :, None], cols[:, None, None, :]]
    return TensorDataset(images + 0.5 * torch.randn(images.shape, generator=generator), labels)


class SmallCNN(nn.Module):
    """Two 3x3 convolutions (ReLU, the first max-pooled), global average
    pooling and a linear classifier."""

    def __init__(self, channels: int = 3, width: int = 16, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = F.max_pool2d(F.relu(self.conv1(images)), 2)
        hidden = F.relu(self.conv2(hidden))
        return self.head(hidden.mean(dim=(2, 3)))


def autocast(device: torch.device, precision: str) -> Any:
    """The forward passes' precision: ``bf16`` or ``fp16`` autocast, or ``fp32`` (none)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


@torch.no_grad()
def evaluate(model: nn.Module, data: TensorDataset, device: torch.device, precision: str) -> dict[str, float]:
    """Mean cross-entropy and accuracy of `model` on all of `data` (every
    rank evaluates the same held-out set, so the ranks agree)."""
    model.eval()
    loss, correct = 0.0, 0
    for images, labels in DataLoader(data, batch_size=256):
        images, labels = images.to(device), labels.to(device)
        with autocast(device, precision):
            outputs = model(images)
        loss += F.cross_entropy(outputs.float(), labels, reduction="sum").item()
        correct += (outputs.argmax(dim=1) == labels).sum().item()
    model.train()
    return {"val_loss": loss / len(data), "val_accuracy": correct / len(data)}


def train(ctx: Any, lr: float = 0.05, weight_decay: float = 5e-4, momentum: float = 0.9,
          batch_size: int | None = None, micro_batches: int = 2, clip: float = 1.0, precision: str = "bf16",
          width: int = 16, samples: int = 2048, held_out: int = 512, classes: int = 10, size: int = 16,
          channels: int = 3, schedule_iterations: int = 1000, seed: int = 0) -> None:
    """Train `SmallCNN` with SGD (momentum, weight decay) under a OneCycle
    schedule peaking at `lr` over the job's iterations (a tuning trial has
    no end: `schedule_iterations`), each batch in `micro_batches` parts
    (gradient accumulation), gradients clipped to norm `clip`, forward
    passes in `precision` (``bf16``, ``fp16`` with a gradient scaler, or
    ``fp32``). `batch_size`, when given, is the global batch this loop is
    meant for (a tuning search may set it): a plan with another is refused.
    Reports ``loss`` and ``accuracy`` every batch, ``val_loss`` and
    ``val_accuracy`` at each epoch's end."""
    if precision not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"precision is {precision!r}, but must be 'bf16', 'fp16' or 'fp32'")
    if batch_size is not None and batch_size != ctx.global_batch:
        raise ValueError(f"batch_size is {batch_size}, but the plan's global batch is {ctx.global_batch}")
    data = synthetic_images(samples + held_out, classes, size, channels, seed)
    train_set = TensorDataset(*(t[:samples] for t in data.tensors))
    held_out_set = TensorDataset(*(t[samples:] for t in data.tensors))

    torch.manual_seed(seed)
    model = SmallCNN(channels, width, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    total = ctx.iterations or schedule_iterations
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=precision == "fp16")
    state = ctx.restore()  # None on a fresh start
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        scaler.load_state_dict(state["scaler"])
    model = ctx.prepare_model(model)  # DDP, gradients weighted by each rank's share of the batch
    checkpoint = {"model": model, "optimizer": optimizer, "schedule": schedule, "scaler": scaler}

    loader = ctx.prepare_loader(DataLoader(train_set, batch_size=64, shuffle=True))  # the plan's batches
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        parts = [(x, y) for x, y in zip(images.tensor_split(micro_batches), labels.tensor_split(micro_batches))
                 if len(y)]
        loss = 0.0
        correct = 0
        for i, (x, y) in enumerate(parts):
            last = i == len(parts) - 1
            with model.no_sync() if not last else contextlib.nullcontext():  # gradients exchanged once, at the end
                with autocast(ctx.device, precision):
                    outputs = model(x)
                    part = F.cross_entropy(outputs.float(), y) * (len(y) / len(labels))  # sums to the batch mean
                scaler.scale(part).backward()
            loss += part.item()
            correct += (outputs.argmax(dim=1) == y).sum().item()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        if schedule.last_epoch < total:  # a trial past `schedule_iterations` stays at the schedule's end
            schedule.step()
        metrics = {"loss": loss, "accuracy": correct / len(labels)}
        if loader.epoch_end:
            metrics.update(evaluate(model.module, held_out_set, ctx.device, precision))
        ctx.report(metrics, checkpoint=checkpoint)
