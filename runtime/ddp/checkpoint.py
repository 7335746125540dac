"""Checkpoints that a crash cannot half-write, and that resume a run exactly.

A checkpoint holds the model and optimizer states, the iteration count (the
data position: `thrifty.runtime.ddp.sharding` makes the stream position
``iteration * global_batch``), and every rank's random number generator
states (torch, CUDA, Python, NumPy), so a resumed run on the same ranks and
batches continues bit for bit as if it had never stopped. After a re-plan
onto other ranks the per-rank streams cannot map one to one; each rank is then
seeded from ``(seed, iteration, rank)``, which is deterministic too.

A checkpoint's location is a local path or an ``s3://bucket/key`` URL, which
every machine of a cluster reaches (`thrifty.runtime.ddp.storage`). Writes
are atomic on both (locally a temporary file, fsync and rename; on S3 one
PUT): a reader, or a restarted run, sees the previous checkpoint or the new
one, never a torn file, so a failure never loses the last good one.
Loading uses ``torch.load(weights_only=True)``: a checkpoint holds tensors and
plain values only.
"""

from __future__ import annotations

import io
import random
import time
from typing import Any

from thrifty.core.errors import ProblemError, ThriftyError
from thrifty.runtime.ddp import storage
from thrifty.runtime.ddp.storage import Location

__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint", "capture_rng", "restore_rng", "rank_seed",
           "seed_everything"]

CHECKPOINT_FORMAT = "thrifty.checkpoint/1"


def save_checkpoint(location: Location, state: dict[str, Any]) -> tuple[float, int]:
    """Write `state` atomically to `location` (a path or an ``s3://bucket/key``
    URL); returns (seconds taken, bytes written)."""
    import torch

    start = time.perf_counter()
    buffer = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, **state}, buffer)
    data = buffer.getvalue()
    storage.write_bytes_atomic(location, data)
    return time.perf_counter() - start, len(data)


def load_checkpoint(location: Location) -> dict[str, Any] | None:
    """The checkpoint at `location`, or None when there is none yet."""
    import torch

    where = storage.describe(location)
    try:
        data = storage.read_bytes(location)
        if data is None:
            return None
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except ThriftyError:
        raise  # a storage failure says what it is
    except Exception as e:  # noqa: BLE001 - any unreadable file is bad input, named
        raise ProblemError(f"cannot read checkpoint: {type(e).__name__}: {e}", source=where) from e
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ProblemError(f"is not a thrifty checkpoint (format must be {CHECKPOINT_FORMAT!r})", source=where)
    return state


def rank_seed(seed: int, iteration: int, rank: int) -> int:
    """The seed of one rank's random streams when a run (re)starts without
    states to restore for it."""
    return (seed * 1_000_003 + iteration * 7_919 + rank) % (2**63 - 1)


def capture_rng(cuda_device: Any = None) -> dict[str, Any]:
    """This process's random states, as tensors and plain values."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
    }
    if cuda_device is not None:
        out["cuda"] = torch.cuda.get_rng_state(cuda_device)
    return out


def restore_rng(state: dict[str, Any], cuda_device: Any = None) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, values, gauss = state["python"]
    random.setstate((version, tuple(values), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if cuda_device is not None and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], cuda_device)


def seed_everything(seed: int) -> None:
    """Seed torch, Python and NumPy's global generators."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
