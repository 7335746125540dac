"""A rank's clock marks, for the online calibration of a training run
(`thrifty.perfmodels.calibration`): how long each iteration spent in the
forward pass, the backward pass up to its last gradient, the exchange after
it, and the optimizer step.

The marks come from hooks, so any loop function gets them without writing a
line (`JobContext.prepare_model` installs them when the job asks,
``JobSpec.clock_every_s``):

- a forward pre-hook and a forward hook on the prepared model time each
  forward pass (several per optimizer step under gradient accumulation: they
  add up);
- a hook after each parameter's gradient is accumulated marks when the last
  gradient of a backward pass was ready: what follows it until the
  optimizer step is the exchange (DDP's allreduce not yet done, its copy
  back, waiting for slower ranks; and whatever the loop does between
  ``backward()`` and ``step()``, such as gradient clipping);
- the optimizer step hooks (torch's global ones, so the loop's own
  optimizer needs no wrapping) time the step and close the optimizer step's
  marks: the time from the first forward to the step, less the forward
  passes, is the backward pass and the exchange, split at the last
  gradient.

An iteration (one `JobContext.report` that advanced) is the sum of its
optimizer steps. After the world's first `TIMING_WARMUP` iterations, each
iteration's components go into cumulative counts, sums and sums of squares,
published under ``CLOCK.format(rank)`` every ``every_s`` seconds, so that the
starter takes any window as the difference of two readings.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from thrifty.runtime.ddp.job import CLOCK
from thrifty.runtime.worlds import RankChannel

__all__ = ["ClockMarks", "PARTS"]

PARTS = ("forward", "backward", "exchange", "step")


class ClockMarks:
    """This rank's clock marks (module docstring)."""

    def __init__(self, model: torch.nn.Module, wrapped: torch.nn.Module, every_s: float):
        self.every_s = every_s
        self.count = 0
        self.sums = [0.0] * 4
        self.squares = [0.0] * 4
        self.published_at = time.monotonic()
        self.on = False  # past the warm-up
        self._iteration = [0.0] * 4  # this iteration's components so far
        self._first_forward: float | None = None  # the optimizer step's first forward start
        self._forward_started = 0.0
        self._forward = 0.0  # this optimizer step's forward passes
        self._ready = 0.0  # the last gradient accumulated
        self._step_started = 0.0
        # the hooks live as long as the rank's process, which serves one world
        wrapped.register_forward_pre_hook(self._before_forward)
        wrapped.register_forward_hook(self._after_forward)
        register_optimizer_step_pre_hook(self._before_step)
        register_optimizer_step_post_hook(self._after_step)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._gradient_ready)

    # -- hooks -----------------------------------------------------------------------
    def _before_forward(self, *_: Any) -> None:
        now = time.perf_counter()
        self._forward_started = now
        if self._first_forward is None:
            self._first_forward = now

    def _after_forward(self, *_: Any) -> None:
        self._forward += time.perf_counter() - self._forward_started

    def _gradient_ready(self, _param: Any) -> None:
        self._ready = time.perf_counter()

    def _before_step(self, *_: Any) -> None:
        self._step_started = time.perf_counter()

    def _after_step(self, *_: Any) -> None:
        end = time.perf_counter()
        if self._first_forward is None:  # a step without a forward pass of the prepared model: not an iteration's
            return
        start, step0 = self._first_forward, self._step_started
        ready = self._ready if start <= self._ready <= step0 else step0
        backward = max(0.0, ready - start - self._forward)
        parts = (self._forward, backward, step0 - ready, end - step0)
        for j, v in enumerate(parts):
            self._iteration[j] += v
        self._first_forward, self._forward = None, 0.0

    # -- iterations -------------------------------------------------------------------
    def iteration_done(self) -> None:
        """An iteration ended (a report that advanced): count it when past the warm-up."""
        parts, self._iteration = self._iteration, [0.0] * 4
        if not self.on:
            return
        self.count += 1
        for j, v in enumerate(parts):
            self.sums[j] += v
            self.squares[j] += v * v

    def publish(self, channel: RankChannel, iteration: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.on or not self.count or (not force and now - self.published_at < self.every_s):
            return
        self.published_at = now
        channel.publish(CLOCK.format(channel.rank), {
            "iteration": iteration, "at": time.time(), "count": self.count,
            "sum": dict(zip(PARTS, self.sums)), "sumsq": dict(zip(PARTS, self.squares))})
