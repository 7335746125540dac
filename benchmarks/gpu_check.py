"""The GPU check (issue 36): on a machine with one NVIDIA GPU, in a few minutes,
measure the zoo's compute profiles there with ``thrifty profile`` (the
largest-batch search, forward, backward, gradient-ready times, DDP's
overhead), measure the reference models whose profiles are derived from
published figures (``thrifty.runtime.measure.reference``) and set each
beside the derived profile of the same GPU, run ``thrifty validate --device
cuda`` at world size 1, and time the largest-batch search on its own.

    bash benchmarks/gpu_check.sh [--out DIR] [--budget-s S] [--device cpu --quick]

It runs on the machine's own Python and torch: the packages thrifty needs
that such a machine lacks come as wheels in ``.whl/`` at the repository root
(see "GPU check" in the README for the download command), installed with
``--no-index --no-deps`` into a folder of their own, beside links to this
tree's packages (as ``pyproject.toml``'s package-dir maps them); nothing is
installed into the machine's Python. Every thrifty command runs in a process
of its own, with a time limit taken from what is left of the budget, and a
step that fails or runs out of time does not stop the ones after it.

What it writes to the output folder (``$OUT`` when set, else
``./gpu-check-out``), a few files because a lent machine sends back few:

- ``gpu_check.log``: everything printed, the commands and their wall times;
- ``machine.json``: GPU, driver, torch, CUDA and cuDNN versions, TF32 settings;
- ``profiles.tar``: the measured profiles under ``datasets/profiles/measured/``
  (provenance: kind measured, the ``thrifty profile`` command, the machine,
  and a note with the driver and math settings), ``thrifty validate``'s
  results and the largest-batch search under ``gpu-check/``; rewritten after
  every step, so a run cut short still returns what it measured;
- ``comparison.txt`` / ``comparison.json``: measured against the derived
  profile of the same GPU (or, on CPU, the shipped measured profile), per
  model and batch: forward, backward, iteration (with the optimizer step) and
  their ratios, and the largest batch;
- ``summary.json``: each step, its command, wall time and outcome.

The exit status is 0 when every required step passed, 1 otherwise.
``--device cpu --quick`` runs the same steps on CPU with tiny settings: a
dry run that finds a missing import or a wrong flag before a GPU is lent.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".gpu-check-owned"  # in the folders this script may wipe and refill
ZOO = ["mlp", "small_cnn", "tiny_transformer", "lstm_text", "conv1d_audio", "embedding_bag"]
REFERENCE_REQUIRED = ["resnet50"]
REFERENCE_OPTIONAL = ["resnet18", "alexnet", "vgg16"]
# A GPU with no derived profile of its own is set beside the nearest one that has: the H200 is the
# H100's chip (the same SMs and clocks) with more and faster memory (141 GB HBM3e at 4.8 TB/s).
NEAREST = {"H200": ("H100",)}
RESERVE_S = 15.0  # kept back from the budget for the comparison and the archive
MIN_STEP_S = 20.0  # a step is not started with less than this left


@dataclass(frozen=True)
class Settings:
    """How hard each step measures: on a GPU within the budget, and `--quick` on CPU."""

    zoo_profile: list[str]
    reference_profile: list[str]
    validate: list[str]
    validate_zoo: tuple[str, str]       # factory, config
    validate_reference: tuple[str, str]
    max_batch: tuple[str, int]          # factory, cap
    references: list[str]
    step_limit_s: float


def settings_for(device: str, quick: bool) -> Settings:
    if quick:
        return Settings(
            zoo_profile=["--batches", "1,4", "--repeats", "2", "--warmup", "1", "--rounds", "1"],
            reference_profile=["--batches", "1,2", "--repeats", "1", "--warmup", "0", "--rounds", "1"],
            validate=["--iterations", "3", "--warmup", "1", "--rounds", "1"],
            validate_zoo=("mlp", "local@4"),
            validate_reference=("resnet18", "local@2"),
            max_batch=("mlp", 8),
            references=["resnet18"],
            step_limit_s=240.0,
        )
    # On a GPU: the largest batch that fits is searched (up to 4096, the profiler's cap) and
    # swept 1, 2, 4, ... up to it; the repeats are what fits the budget with the derived models.
    return Settings(
        zoo_profile=["--repeats", "10", "--warmup", "3", "--rounds", "2"],
        reference_profile=["--repeats", "6", "--warmup", "2", "--rounds", "2"],
        validate=["--iterations", "20", "--warmup", "5", "--rounds", "2"],
        validate_zoo=("mlp", "local@32"),
        validate_reference=("resnet50", "local@128"),
        max_batch=("resnet50", 4096),
        references=REFERENCE_REQUIRED + REFERENCE_OPTIONAL,
        step_limit_s=150.0,
    )


# --- output -------------------------------------------------------------------------------------


class Log:
    """Prints to the console and appends to the log file, flushed line by line."""

    def __init__(self, path: Path):
        import threading

        self.file: TextIO = path.open("a", encoding="utf-8")
        self.lock = threading.Lock()  # the output readers of a step's process call it too

    def __call__(self, line: str = "") -> None:
        with self.lock:
            print(line, flush=True)
            self.file.write(line + "\n")
            self.file.flush()


@dataclass
class Step:
    name: str
    required: bool
    command: str = ""
    wall_s: float = 0.0
    outcome: str = "not run"  # passed, failed (rc N), timed out, skipped (...)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "passed"


@dataclass
class Check:
    args: argparse.Namespace
    log: Log
    stage: Path
    site: Path | None
    settings: Settings
    started: float
    deadline: float
    steps: list[Step] = field(default_factory=list)
    device_key: str = ""

    # --- running ---------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.site is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.site), env.get("PYTHONPATH", "")) if p)
        return env

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, argv: list[str], *, required: bool, shown: str | None = None,
            capture: bool = False) -> tuple[Step, str]:
        """Run `argv` in the stage folder with what is left of the budget, echo its
        output as it comes, and record the step. Returns the step and, with
        `capture`, its standard output."""
        step = Step(name, required, command=shown or shlex.join(argv))
        self.steps.append(step)
        only = self.args.only
        if only and name != "machine" and name not in only and not any(word in name.split() for word in only):
            step.outcome = "skipped (--only)"
            self.log(f"--- {name}: skipped (not named by --only)")
            return step, ""
        left = self.remaining() - RESERVE_S
        if left < MIN_STEP_S:
            step.outcome = "skipped (time budget)"
            self.log(f"--- {name}: skipped, {max(0.0, left):.0f} s of the budget left")
            return step, ""
        limit = min(self.settings.step_limit_s, left)
        self.log(f"--- {name} (limit {limit:.0f} s)")
        self.log(f"$ {step.command}")
        started = time.monotonic()
        out_lines: list[str] = []
        try:
            process = subprocess.Popen(argv, cwd=self.stage, env=self.env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT if not capture else subprocess.PIPE,
                                       text=True, bufsize=1, start_new_session=True)
        except OSError as e:
            step.outcome, step.detail = "failed (could not start)", str(e)
            self.log(f"    could not start: {e}")
            return step, ""
        timed_out = False
        try:
            stdout, stderr = _communicate(process, limit, self.log, capture)
            out_lines = stdout
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(process)
        step.wall_s = time.monotonic() - started
        if timed_out:
            step.outcome = f"timed out ({limit:.0f} s)"
        elif process.returncode == 0:
            step.outcome = "passed"
        else:
            step.outcome = f"failed (exit {process.returncode})"
        self.log(f"    {name}: {step.outcome}, {step.wall_s:.1f} s")
        return step, "".join(out_lines)

    def thrifty(self, name: str, words: list[str], *, required: bool) -> Step:
        """``thrifty WORDS`` as ``python -m thrifty.runtime.cli``, shown as the user types it."""
        step, _ = self.run(name, [sys.executable, "-m", "thrifty.runtime.cli", *words], required=required,
                           shown=shlex.join(["thrifty", *words]))
        self.archive()
        return step

    # --- outputs ---------------------------------------------------------------------------

    def archive(self) -> None:
        """The stage's results as ``profiles.tar`` in the output folder (atomically)."""
        out = Path(self.args.out)
        tmp = out / ".profiles.tar.tmp"
        with tarfile.open(tmp, "w") as tar:
            for sub in ("datasets", "gpu-check"):
                if (self.stage / sub).exists():
                    tar.add(self.stage / sub, arcname=sub)
        os.replace(tmp, out / "profiles.tar")


def _communicate(process: subprocess.Popen, limit: float, log: Log, capture: bool) -> tuple[list[str], str]:
    """Echo the process's output line by line (standard output kept instead,
    with `capture`) until it exits; `subprocess.TimeoutExpired` past `limit`.
    Reader threads, so that a child that hangs mid-line cannot hold the clock."""
    import threading

    captured: list[str] = []

    def read(stream: Any, keep: bool) -> None:
        for line in stream:
            if keep:
                captured.append(line)
            else:
                log("    " + line.rstrip("\n"))

    readers = [threading.Thread(target=read, args=(process.stdout, capture), daemon=True)]
    if capture and process.stderr is not None:
        readers.append(threading.Thread(target=read, args=(process.stderr, False), daemon=True))
    for reader in readers:
        reader.start()
    process.wait(timeout=limit)
    for reader in readers:
        reader.join(timeout=10)
    return captured, ""


def _stop(process: subprocess.Popen) -> None:
    """End the step's process group (it was started in a session of its own)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# --- installing ------------------------------------------------------------------------------


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:4])


def _carried(wheels: Path) -> list[tuple[Path, str, str]]:
    """(wheel, distribution, version) for each wheel in `wheels`."""
    found = []
    for wheel in sorted(wheels.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        found.append((wheel, name, version))
    return found


def _owned_folder(path: Path) -> Path:
    """`path` emptied for this script: created, or wiped when an earlier run of it made it."""
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise SystemExit(f"{path} exists and was not made by this script: give another folder")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by benchmarks/gpu_check.py; wiped by its next run\n")
    return path


def install(site: Path, wheels: Path, log: Log) -> Step:
    """The carried wheels the machine lacks (or has older) into `site`, and
    ``site/thrifty/<package>`` links to this tree's packages."""
    step = Step("install", True, command=f"install {wheels} -> {site}")
    started = time.monotonic()
    log(f"--- install: wheels from {wheels} and this tree's packages into {site}")
    wanted = []
    if not wheels.is_dir():
        log(f"    no folder {wheels}: nothing to install (on a lent machine, carry '.whl' with the command)")
    for wheel, name, version in _carried(wheels) if wheels.is_dir() else []:
        try:
            have = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            have = None
        if have is not None and _version_key(have) >= _version_key(version):
            log(f"    {name} {have} is here (carried {version}): kept")
            continue
        log(f"    {name} {version}: installing (here: {have or 'none'})")
        wanted.append(wheel)
    problems = []
    if wanted:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(site), *map(str, wanted)]
        log(f"$ {shlex.join(pip)}")
        done = subprocess.run(pip, capture_output=True, text=True)
        if done.returncode != 0:
            log(f"    pip failed (exit {done.returncode}): {done.stderr.strip()[-800:]}; unpacking the wheels instead")
            import zipfile

            for wheel in wanted:
                try:
                    with zipfile.ZipFile(wheel) as archive:
                        archive.extractall(site)
                except (OSError, zipfile.BadZipFile) as e:
                    problems.append(f"{wheel.name}: {e}")
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = site / "thrifty"
    package.mkdir(exist_ok=True)
    for dotted, folder in mapping.items():
        parts = dotted.split(".")
        if len(parts) == 2:  # thrifty.X -> X/ (the subpackages are X's own subfolders)
            (package / parts[1]).symlink_to(ROOT / folder, target_is_directory=True)
    step.wall_s = time.monotonic() - started
    step.outcome = "passed" if not problems else "failed (" + "; ".join(problems) + ")"
    log(f"    install: {step.outcome}, {step.wall_s:.1f} s")
    return step


# --- children: run in a process of their own, with thrifty and torch importable ------------------


# what the steps import in their processes (the workers' too): a missing package shows here first, by name
STEP_MODULES = [
    "thrifty.runtime.cli", "thrifty.runtime.commands.profile", "thrifty.runtime.commands.validate",
    "thrifty.runtime.measure.profiler", "thrifty.runtime.measure.colocated", "thrifty.runtime.measure.truth",
    "thrifty.runtime.measure.zoo", "thrifty.runtime.measure.reference", "thrifty.perfmodels.simulator",
    "thrifty.perfmodels.compute", "thrifty.perfmodels.library", "thrifty.perfmodels.loading",
    "thrifty.datasets.catalog", "rich.console", "rich.table",
]


def child_env(device: str) -> int:
    """Print the machine's description as JSON (``machine.json``); exit 1 when
    a module the steps import cannot be imported."""
    import importlib
    import platform

    import torch

    failed: dict[str, str] = {}
    for name in STEP_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # every missing module is named, not just the first
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"cannot import {name}: {failed[name]}", file=sys.stderr, flush=True)

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": getattr(torch.version, "cuda", None),
        "cuda_available": torch.cuda.is_available(),
        "cpus": os.cpu_count(),
        "device": device,
        "imports_failed": failed,
    }
    try:
        from thrifty.runtime.measure.workloads import device_label, machine_description
    except Exception:
        print(json.dumps(info))
        return 1
    if device == "cuda" and not torch.cuda.is_available():
        print(json.dumps(info))  # the check stops: nothing below can be read
        return 1
    info["device_key"] = device_label(device)
    info["machine"] = machine_description(device, 1)
    if device == "cuda":
        def nccl() -> str:
            version = torch.cuda.nccl.version()
            return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)

        for key, read in (
            ("gpu", lambda: torch.cuda.get_device_name(0)),
            ("gpus", torch.cuda.device_count),
            ("capability", lambda: ".".join(map(str, torch.cuda.get_device_capability(0)))),
            ("gpu_memory_gib", lambda: round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2)),
            ("cudnn", torch.backends.cudnn.version),
            ("nccl", nccl),
            ("tf32_matmul", lambda: torch.backends.cuda.matmul.allow_tf32),
            ("tf32_cudnn", lambda: torch.backends.cudnn.allow_tf32),
            ("cudnn_benchmark", lambda: torch.backends.cudnn.benchmark),
            ("float32_matmul_precision", torch.get_float32_matmul_precision),
        ):
            try:  # one figure that cannot be read must not lose the others
                info[key] = read()
            except Exception as e:
                info[key] = f"not read: {type(e).__name__}: {e}"
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,"
                                  "clocks.max.sm", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30)
            info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
            info["driver"] = smi.stdout.split(",")[1].strip() if smi.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError) as e:
            info["nvidia_smi"] = f"not available: {e}"
            info["driver"] = None
    print(json.dumps(info))
    return 1 if failed else 0


def child_max_batch(factory: str, cap: int, device: str) -> None:
    """Run the largest-batch search on its own (``search_max_batch`` over
    ``iteration_fits``, as ``thrifty profile`` does on CUDA) and print the
    result, the trials and the time as JSON."""
    from thrifty.runtime.measure.memory import iteration_fits, search_max_batch
    from thrifty.runtime.measure.timing import make_trainer
    from thrifty.runtime.measure.workloads import import_torch, load_workload

    torch = import_torch()
    torch.set_num_threads(1)
    trainer = make_trainer(torch, load_workload(factory), device, None)
    trials: list[dict[str, Any]] = []

    def fits(batch: int) -> bool:
        started = time.perf_counter()
        ok = iteration_fits(trainer, batch)
        trials.append({"batch": batch, "fits": ok, "s": round(time.perf_counter() - started, 4)})
        print(f"batch {batch}: {'fits' if ok else 'out of memory'} ({trials[-1]['s']:.2f} s)", file=sys.stderr,
              flush=True)
        return ok

    started = time.perf_counter()
    found = search_max_batch(fits, cap)
    result = {"factory": factory, "device": device, "cap": cap, "max_batch": found,
              "source": None if found is None else ("cap" if found == cap else "oom_search"),
              "seconds": round(time.perf_counter() - started, 3), "trials": trials}
    if device == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    print(json.dumps(result))


# --- comparison ------------------------------------------------------------------------------


def _iteration(point: dict[str, Any], step_s: float) -> float:
    return point["forward_s"] + point["backward_s"] + step_s


def compare(stage: Path, device_key: str) -> tuple[str, dict[str, Any]]:
    """Each measured profile beside the reference profile of the same model on
    the same device: the derived one, else the shipped measured one."""
    rows, models = [], []
    measured_dir = stage / "datasets" / "profiles" / "measured"
    for path in sorted(measured_dir.glob(f"*__{device_key}.json")):
        measured = json.loads(path.read_text())
        name = measured["model"]
        reference_path = None
        for key in (device_key, *NEAREST.get(device_key, ())):
            for kind in ("derived", "measured"):
                candidate = ROOT / "datasets" / "profiles" / kind / f"{name}__{key}.json"
                if candidate.exists() and reference_path is None:
                    reference_path = candidate
        model: dict[str, Any] = {
            "model": name, "measured_max_batch": measured["max_batch"],
            "max_batch_source": measured.get("extra", {}).get("max_batch_source"),
            "measured_step_s": measured["step_s"], "ddp_overhead_s": measured.get("ddp_overhead_s"),
            "measured_grad_bytes": sum(layer["grad_bytes"] for layer in measured["layers"]),
            "reference": None,
        }
        models.append(model)
        if reference_path is None:
            continue
        reference = json.loads(reference_path.read_text())
        model.update({
            "reference": str(reference_path.relative_to(ROOT)),
            "reference_kind": reference["provenance"]["kind"],
            "reference_max_batch": reference["max_batch"],
            "reference_step_s": reference["step_s"],
            "reference_grad_bytes": sum(layer["grad_bytes"] for layer in reference["layers"]),
        })
        theirs = {p["batch"]: p for p in reference["points"]}
        for point in measured["points"]:
            other = theirs.get(point["batch"])
            if other is None:
                continue
            kind = reference["provenance"]["kind"]
            if reference["device"] != device_key:
                kind += f":{reference['device']}"
            row = {"model": name, "batch": point["batch"], "kind": kind}
            for part, mine, ref in (
                ("forward", point["forward_s"], other["forward_s"]),
                ("backward", point["backward_s"], other["backward_s"]),
                ("iteration", _iteration(point, measured["step_s"]), _iteration(other, reference["step_s"])),
            ):
                row[f"{part}_measured_s"], row[f"{part}_reference_s"] = mine, ref
                row[f"{part}_ratio"] = mine / ref if ref > 0 else None
            rows.append(row)
        common = [r for r in rows if r["model"] == name]
        if common:
            top = common[-1]
            model["largest_common_batch"] = top["batch"]
            model["iteration_ratio_at_largest_common_batch"] = top["iteration_ratio"]
    return _table(device_key, models, rows), {"device": device_key, "models": models, "points": rows}


def _table(device_key: str, models: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    out.write(f"Measured on {device_key} against the reference profile of the same device (derived from "
              "published figures, or shipped measured; kind:DEVICE where it is the nearest device's); "
              "ratio = measured / reference\n\n")
    header = (f"{'model':<18}{'kind':>14}{'batch':>7}{'fwd ms':>10}{'ref':>10}{'ratio':>7}{'bwd ms':>10}"
              f"{'ref':>10}{'ratio':>7}{'iter ms':>10}{'ref':>10}{'ratio':>7}")
    out.write(header + "\n" + "-" * len(header) + "\n")
    for r in rows:
        out.write(f"{r['model']:<18}{r['kind']:>14}{r['batch']:>7}")
        for part in ("forward", "backward", "iteration"):
            ratio = r[f"{part}_ratio"]
            out.write(f"{r[f'{part}_measured_s'] * 1e3:>10.3f}{r[f'{part}_reference_s'] * 1e3:>10.3f}"
                      f"{'-' if ratio is None else f'{ratio:.2f}':>7}")
        out.write("\n")
    out.write("\nper model: largest batch (measured, source / reference), optimizer step, gradient bytes, "
              "DDP overhead\n")
    for m in models:
        ref = m["reference"]
        line = (f"{m['model']:<18} max_batch {m['measured_max_batch']} ({m['max_batch_source']})"
                f" / {m.get('reference_max_batch', '-')}, step {m['measured_step_s'] * 1e3:.3f} ms")
        if ref is not None:
            line += f" / {m['reference_step_s'] * 1e3:.3f} ms"
        line += f", grads {m['measured_grad_bytes'] / 1e6:.2f} MB"
        if ref is not None:
            line += f" / {m['reference_grad_bytes'] / 1e6:.2f} MB"
        ddp = m["ddp_overhead_s"] or 0.0  # a profile leaves out an overhead of 0 (measured as none)
        line += f", DDP overhead {ddp * 1e3:.3f} ms"
        if m.get("largest_common_batch") is not None and m["iteration_ratio_at_largest_common_batch"] is not None:
            line += (f", iteration at batch {m['largest_common_batch']}: "
                     f"{m['iteration_ratio_at_largest_common_batch']:.2f}x the reference")
        line += f"  [{ref or 'no reference profile on this device'}]"
        out.write(line + "\n")
    return out.getvalue()


# --- the check -------------------------------------------------------------------------------


def _note(profile_path: Path, machine: dict[str, Any]) -> None:
    """Add the driver and math settings to a measured profile's provenance notes."""
    data = json.loads(profile_path.read_text())
    bits = [f"measured by benchmarks/gpu_check.sh on {machine.get('gpu') or machine.get('device')}"]
    if machine.get("device") == "cuda":
        bits.append(f"NVIDIA driver {machine.get('driver')}, CUDA {machine.get('torch_cuda')}, "
                    f"cuDNN {machine.get('cudnn')}, NCCL {machine.get('nccl')}")
        bits.append(f"TF32 matmul {machine.get('tf32_matmul')}, TF32 cuDNN {machine.get('tf32_cudnn')}, "
                    f"cudnn.benchmark {machine.get('cudnn_benchmark')}")
    bits.append(f"torch {machine.get('torch')}, Python {machine.get('python')}")
    provenance = data["provenance"]
    provenance["notes"] = "; ".join(filter(None, [provenance.get("notes"), ", ".join(bits)]))
    tmp = profile_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, profile_path)


def main_check(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("gpu_check.log", "machine.json", "comparison.txt", "comparison.json", "summary.json",
                  "profiles.tar"):
        (out / stale).unlink(missing_ok=True)
    log = Log(out / "gpu_check.log")
    budget = args.budget_s if args.budget_s is not None else (600.0 if args.quick else 450.0)
    log(f"gpu check: device {args.device}{' (quick)' if args.quick else ''}, budget {budget:.0f} s, "
        f"output {out.resolve()}, tree {ROOT}, Python {sys.executable}")
    stage = _owned_folder(Path(args.stage))
    (stage / "gpu-check").mkdir()
    site = None if args.no_install else _owned_folder(Path(args.site))
    check = Check(args, log, stage, site, settings_for(args.device, args.quick), started,
                  started + budget)
    if site is not None:
        check.steps.append(install(site, Path(args.wheels), log))

    this = str(Path(__file__).resolve())
    step, text = check.run("machine", [sys.executable, this, "--child", "env", "--device", args.device],
                           required=True, capture=True)
    machine: dict[str, Any] = {}
    try:  # also from a failed step: it says what it could read
        machine = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        step.outcome = step.outcome if not step.ok else "failed (no JSON)"
    if machine.get("imports_failed"):
        step.outcome = f"failed (cannot import {', '.join(machine['imports_failed'])})"
    (out / "machine.json").write_text(json.dumps(machine, indent=1) + "\n")
    for key in ("machine", "gpu", "driver", "nvidia_smi", "cudnn", "nccl", "tf32_matmul", "tf32_cudnn"):
        if key in machine:
            log(f"    {key}: {machine[key]}")
    check.device_key = machine.get("device_key") or ("cpu" if args.device == "cpu" else "unknown")
    if args.device == "cuda" and machine and not machine.get("cuda_available"):
        step.outcome = "failed (torch sees no CUDA device)"
        log(f"torch {machine.get('torch')} sees no CUDA device: stopping")
        return finish(check, out)
    key = check.device_key
    settings = check.settings
    measured = Path("datasets") / "profiles" / "measured"
    (stage / measured).mkdir(parents=True)

    def profile(module: str, factory: str, extra: list[str], required: bool) -> None:
        name = factory.replace("_", "-")
        path = measured / f"{name}__{key}.json"
        words = ["profile", f"thrifty.runtime.measure.{module}:{factory}", "--out", str(path), "--name", name,
                 *extra, "--device", args.device, "--no-progress"]
        step = check.thrifty(f"profile {name}", words, required=required)
        if step.ok and (stage / path).exists() and machine:
            _note(stage / path, machine)
            check.archive()

    for factory in ZOO:
        profile("zoo", factory, settings.zoo_profile, True)
    references = settings.references
    profile("reference", references[0], settings.reference_profile, True)

    def validate(factory: str, config: str, required: bool) -> None:
        name = factory.replace("_", "-")
        module = "zoo" if factory in ZOO else "reference"
        words = ["validate", f"thrifty.runtime.measure.{module}:{factory}", "--config", config,
                 "--device", args.device, *settings.validate, "--out", f"gpu-check/validate-{name}.json"]
        if (stage / measured / f"{name}__{key}.json").exists():
            words += ["--profile", str(measured / f"{name}__{key}.json")]
        check.thrifty(f"validate {name} {config}", words, required=required)

    validate(*settings.validate_zoo, True)

    factory, cap = settings.max_batch
    module = "zoo" if factory in ZOO else "reference"
    spec = f"thrifty.runtime.measure.{module}:{factory}"
    step, text = check.run(f"max-batch search {factory}",
                           [sys.executable, this, "--child", "max-batch", spec, str(cap), "--device", args.device],
                           required=True, capture=True,
                           shown=f"search_max_batch(iteration_fits, {cap}) on {spec}")
    if step.ok:
        try:
            result = json.loads(text.strip().splitlines()[-1])
            (stage / "gpu-check" / f"max-batch-{factory.replace('_', '-')}.json").write_text(
                json.dumps(result, indent=1) + "\n")
            log(f"    largest batch {result['max_batch']} ({result['source']}) in {result['seconds']:.1f} s, "
                f"{len(result['trials'])} trials")
        except (ValueError, IndexError, KeyError):
            step.outcome = "failed (no JSON)"
    check.archive()

    validate(*settings.validate_reference, False)
    for factory in references[1:]:
        profile("reference", factory, settings.reference_profile, False)
    return finish(check, out)


def finish(check: Check, out: Path) -> int:
    log = check.log
    step = Step("compare", True, command="compare measured with reference profiles")
    started = time.monotonic()
    try:
        text, document = compare(check.stage, check.device_key)
        (out / "comparison.txt").write_text(text)
        (out / "comparison.json").write_text(json.dumps(document, indent=1) + "\n")
        log("--- comparison")
        for line in text.splitlines():
            log(line)
        step.outcome = "passed"
    except Exception as e:  # the report must still be written
        step.outcome, step.detail = "failed", f"{type(e).__name__}: {e}"
        log(f"    comparison failed: {step.detail}")
    step.wall_s = time.monotonic() - started
    check.steps.append(step)
    check.archive()
    failed = [s for s in check.steps if s.required and not s.ok]
    log("--- steps (command, wall time, outcome)")
    for s in check.steps:
        shown = s.command if len(s.command) <= 110 else s.command[:107] + "..."  # in full above and in summary.json
        log(f"  {'req' if s.required else 'opt'} {s.outcome:<24} {s.wall_s:7.1f} s  {shown}")
    total = time.monotonic() - check.started
    log(f"total {total:.1f} s; {len(failed)} required step(s) not passed"
        + (": " + ", ".join(s.name for s in failed) if failed else ""))
    summary = {"device": check.args.device, "quick": check.args.quick, "device_key": check.device_key,
               "total_s": round(total, 1), "failed": [s.name for s in failed],
               "steps": [vars(s) for s in check.steps]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny settings (a dry run on CPU)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out",
                        help="output folder (default $OUT, else ./gpu-check-out)")
    parser.add_argument("--budget-s", type=float, help="wall-clock budget (default 450 s; 600 s with --quick)")
    parser.add_argument("--wheels", default=str(ROOT / ".whl"), help="the carried wheels (default .whl/)")
    parser.add_argument("--site", default="/tmp/gpu-check-site", help="where they and thrifty's links go")
    parser.add_argument("--stage", default="/tmp/gpu-check-stage", help="where the steps write their files")
    parser.add_argument("--no-install", action="store_true",
                        help="use this Python's packages and thrifty as installed (install nothing)")
    parser.add_argument("--only", type=lambda s: [w for w in s.split(",") if w],
                        help="run only the steps named by one of these comma-separated words or whole step names "
                             "(model names such as resnet50, 'validate', 'profile vgg16'); the others are "
                             "reported as skipped, which counts as not passed for a required step")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        what, *rest = args.child
        if what == "env":
            return child_env(args.device)
        elif what == "max-batch":
            child_max_batch(rest[0], int(rest[1]), args.device)
        else:
            parser.error(f"unknown child {what}")
        return 0
    return main_check(args)


if __name__ == "__main__":
    sys.exit(main())
