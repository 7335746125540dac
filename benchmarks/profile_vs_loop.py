"""What `thrifty profile` measures against what a training loop costs (issue
"Predictions that hold on models thrifty has not seen": the profile
under-predicts some architectures even at one process, with no
communication).

For each zoo model and batch, every variant runs in a fresh Python process
(one torch thread) so that no process state carries over, and the variants
are interleaved over `--rounds` rounds (this VM's speed drifts over minutes).
Each prints the mean iteration time in milliseconds:

- ``profile``: `profile_workload` itself on the sweep ``[b, 2b]`` (forward,
  backward and step timed apart, the garbage collector paused, gradients
  zeroed in place, one batch reused); the sum of the three means at ``b``;
- ``loop``: the plain loop a user writes and thrifty's worker runs:
  ``zero_grad()`` (gradients freed), forward, loss, backward, ``step()``,
  plain SGD, a new batch each iteration from 4 made in advance, the garbage
  collector on, 3 warm-up then `--iters` timed iterations back to back;
- one change at a time from ``loop`` toward ``profile``: ``loop-keep-grads``
  (``zero_grad(set_to_none=False)``), ``loop-no-gc`` (collector paused),
  ``loop-same-batch``, ``loop-split`` (clock marks between the phases),
  ``loop-after-large`` (first iterations at 8x the batch, as the profiler
  warms up at the sweep's largest batch), ``loop-momentum`` (SGD with
  momentum 0.9, the profiler's optimizer).

``python benchmarks/profile_vs_loop.py [--models lstm-text,conv1d-audio,mlp]
[--batches 16,64] [--rounds 3] [--iters 15]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

VARIANTS = ("profile", "loop", "loop-keep-grads", "loop-no-gc", "loop-same-batch", "loop-split",
            "loop-after-large", "loop-momentum", "profile-mallopt", "loop-mallopt")

CHILD = r'''
import ctypes, gc, json, sys, time
model_name, batch, variant, iters = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if variant.endswith("-mallopt"):  # glibc: fixed thresholds, no dynamic mmap/trim adjustment
    libc = ctypes.CDLL("libc.so.6")
    assert libc.mallopt(-3, 32 * 1024 * 1024) == 1   # M_MMAP_THRESHOLD
    assert libc.mallopt(-1, 1024 * 1024 * 1024) == 1  # M_TRIM_THRESHOLD
    variant = variant[: -len("-mallopt")]
import torch
torch.set_num_threads(1)
from thrifty.runtime.measure import zoo
work = zoo.FACTORIES[model_name](seed=0)
if variant == "profile":
    from thrifty.runtime.measure import profile_workload
    p = profile_workload(work, model_name=model_name, batches=[batch, 2 * batch], repeats=30, rounds=3,
                         progress=False)
    pt = next(q for q in p.points if q.batch == batch)
    print(json.dumps((pt.forward_s + pt.backward_s) * 1e3 + p.step_s * 1e3))
    sys.exit(0)
model = work.model
momentum = 0.9 if variant == "loop-momentum" else 0.0
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=momentum)
data = [work.make_batch(batch) for _ in range(4)]
if variant == "loop-after-large":
    big = work.make_batch(8 * batch)
    for _ in range(2):
        opt.zero_grad(); work.loss_fn(model(big[0]), big[1]).backward(); opt.step()
if variant == "loop-no-gc":
    gc.collect(); gc.disable()
times = []
for i in range(3 + iters):
    x, y = data[0] if variant == "loop-same-batch" else data[i % 4]
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=variant != "loop-keep-grads")
    out = model(x)
    loss = work.loss_fn(out, y)
    if variant == "loop-split":
        t1 = time.perf_counter()
    loss.backward()
    if variant == "loop-split":
        t2 = time.perf_counter()
    opt.step()
    if i >= 3:
        times.append(time.perf_counter() - t0)
print(json.dumps(sum(times) / len(times) * 1e3))
'''


def run(model: str, batch: int, variant: str, iters: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(batch), variant, str(iters)],
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="lstm-text,conv1d-audio,mlp")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args(argv)
    cells = [(m, int(b)) for m in args.models.split(",") for b in args.batches.split(",")]
    variants = args.variants.split(",")
    got: dict[tuple[str, int, str], list[float]] = {}
    for r in range(args.rounds):
        for model, batch in cells:
            for variant in variants:
                got.setdefault((model, batch, variant), []).append(run(model, batch, variant, args.iters))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'model':<14} {'batch':>5} " + " ".join(f"{v:>16}" for v in variants))
    for model, batch in cells:
        reference = "loop" if "loop" in variants else variants[-1]
        base = statistics.median(got[(model, batch, reference)])
        row = []
        for v in variants:
            ms = statistics.median(got[(model, batch, v)])
            row.append(f"{ms:8.2f} ({ms / base - 1:+4.0%})")
        print(f"{model:<14} {batch:>5} " + " ".join(f"{c:>16}" for c in row))
    reference = "loop" if "loop" in variants else variants[-1]
    print(f"each cell: median over rounds of the mean iteration ms, and its difference from `{reference}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
