"""One host-memory allocator policy for every process that trains or times
training: the profiler and every worker thrifty starts (issue "Predictions
that hold on models thrifty has not seen").

Why (``benchmarks/profile_vs_loop.py`` measures it, one torch thread, each
variant in a fresh process; its output has the figures): a plain training
loop of the 2-layer LSTM at batch 16 ran markedly slower an iteration than
`thrifty profile` measured. Changing the loop one thing at a time toward the
profiler, only one change closed the gap: first running two iterations at 8x
the batch, which is what the profiler does before its sweep. The cause is glibc's malloc: its mmap and trim thresholds
start at 128 KiB and grow with the largest block freed so far. In a fresh
process the LSTM's activations (1.5 MB at batch 16) are mapped and unmapped,
and the heap's top trimmed, every iteration, each time paying page faults for
memory that is zeroed again; after a larger batch the thresholds have grown
and the same buffers are reused from the heap. The MLP shows the same with
its freed gradients (``zero_grad()`` sets them to None). So a profile's
numbers depended on the history of the process that took them, and a
worker's on its own.

`settle` fixes both thresholds (``mallopt``; a fixed value turns glibc's
dynamic adjustment off): blocks up to 32 MiB come from the heap, and the
heap is not trimmed below 1 GiB of free space, so a training loop's buffers
are reused from the first iterations on, as PyTorch's caching allocator does
on a GPU. The profiler calls it before it measures, and the fork server calls
it before it forks any worker, so workers, co-located profiling workers,
scaling worlds and benchmark truth loops all run under it. With it the LSTM
loop runs as fast as its profile says, give or take the noise of timing.
Memory a process has freed stays with it until it exits (as on a GPU).
``THRIFTY_MALLOC=default`` leaves glibc's own behaviour. Elsewhere (musl,
macOS) nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["settle", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "describe"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024     # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024

_settled: str | None = None


def settle() -> str | None:
    """Fix glibc's malloc thresholds in this process (and the processes it will
    fork); a description of the policy, or None where it does not apply."""
    global _settled
    if _settled is not None:
        return _settled
    if os.environ.get("THRIFTY_MALLOC", "") == "default" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and \
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    except (OSError, AttributeError):
        return None
    _settled = describe() if ok else None
    return _settled


def describe() -> str:
    return (f"glibc malloc: mmap threshold {MMAP_THRESHOLD_BYTES >> 20} MiB, "
            f"trim threshold {TRIM_THRESHOLD_BYTES >> 20} MiB (thrifty.runtime.worlds.allocator)")
