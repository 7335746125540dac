"""Checkpoints on storage every machine reaches (`thrifty.runtime.ddp.storage`):
a local path, or an ``s3://bucket/key`` URL against a real moto server on
127.0.0.1 (one per module, reached through ``AWS_ENDPOINT_URL_S3`` as a
worker on another machine would reach S3). Failures are injected mid-write
(a local fsync that fails, an S3 upload cut off halfway, an AWS error from a
botocore event hook) and the previous checkpoint must survive each.

`moto` is marked per test here, down to a fixture's parameter (the file
mixes local and S3 cases); `process` is derived from what a test does, as
everywhere (tests/markers.py)."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from aws_fakes import MotoServer, fake_aws_env, raise_on
from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.ddp import storage
from thrifty.runtime.ddp.job import JobSpec

TINY = "thrifty.runtime.training.examples:tiny_mlp"
S3 = pytest.mark.moto


@pytest.fixture(scope="module")
def moto():
    with pytest.MonkeyPatch.context() as mp, fake_aws_env(mp):
        server = MotoServer().start()
        mp.setenv("AWS_ENDPOINT_URL_S3", server.url)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def bucket(moto) -> str:
    name = f"thrifty-test-{uuid.uuid4().hex[:12]}"
    moto.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["local", pytest.param("s3", marks=S3)])
def location(request, tmp_path) -> str:
    """Where a checkpoint goes: a path in a new folder, or a key in a new bucket."""
    if request.param == "local":
        return str(tmp_path / "run" / "checkpoint.pt")
    return f"s3://{request.getfixturevalue('bucket')}/run/checkpoint.pt"


# -- locations ------------------------------------------------------------------------------

@pytest.mark.parametrize("given, expected", [
    ("run/checkpoint.pt", "run/checkpoint.pt"),
    ("/shared/run/checkpoint.pt", "/shared/run/checkpoint.pt"),
    ("s3://bucket/run/checkpoint.pt", "s3://bucket/run/checkpoint.pt"),
    ("S3://bucket/checkpoint.pt", "s3://bucket/checkpoint.pt"),
])
def test_a_location_is_a_path_or_an_s3_object(given, expected):
    assert storage.describe(given) == expected
    assert storage.is_remote(given) == expected.startswith("s3://")


@pytest.mark.parametrize(("folder", "parts", "expected"), [
    ("s3://bucket", ("run", "trial-0", "checkpoint.pt"), "s3://bucket/run/trial-0/checkpoint.pt"),
    ("s3://bucket/tuning/", ("run", "trial-1"), "s3://bucket/tuning/run/trial-1"),
    ("runs/tuning", ("trial-2", "checkpoint.pt"), "runs/tuning/trial-2/checkpoint.pt"),
])
def test_a_storage_folder_joins_like_a_path_on_disk_and_on_s3(folder, parts, expected):
    assert storage.join(folder, *parts) == expected
    assert storage.is_remote_folder(folder) == folder.startswith("s3://")


@pytest.mark.parametrize(("bad", "message"), [
    ("", "is empty"), ("gs://bucket/x", "'gs://' is not supported"), ("s3://", "must name a bucket"),
    ("s3:///prefix", "must name a bucket"),
])
def test_a_bad_storage_folder_is_bad_input(bad, message):
    with pytest.raises(ProblemError, match=message):
        storage.join(bad, "trial-0")


@pytest.mark.parametrize("bad, message", [
    ("", "is empty"),
    ("gs://bucket/checkpoint.pt", "'gs://' is not supported"),
    ("s3://bucket", "must name a bucket and an object key"),
    ("s3://bucket/", "must name a bucket and an object key"),
    ("s3:///checkpoint.pt", "must name a bucket and an object key"),
    ("s3://bucket/run/", "must name a bucket and an object key"),
])
def test_a_bad_location_is_bad_input_and_a_job_names_its_field(bad, message):
    with pytest.raises(ProblemError, match=message):
        storage.parse(bad)
    with pytest.raises(ProblemError, match=message) as caught:
        JobSpec(trainer="m:f", global_batch=8, iterations=2, batches=(8,), checkpoint_path=bad)
    assert caught.value.path == "checkpoint_path"


def test_a_job_takes_an_s3_checkpoint_and_round_trips_it(tmp_path):
    job = JobSpec(trainer="m:f", global_batch=8, iterations=2, batches=(8,),
                  checkpoint_path="s3://bucket/run/checkpoint.pt")
    job.write(tmp_path / "job.json")
    assert JobSpec.read(tmp_path / "job.json") == job


# -- reading and writing ----------------------------------------------------------------------

def test_round_trip_and_absence(location):
    assert not storage.exists(location)
    assert storage.read_bytes(location) is None
    storage.write_bytes_atomic(location, b"first")
    assert storage.exists(location) and storage.read_bytes(location) == b"first"
    storage.write_bytes_atomic(location, b"second" * 1000)
    assert storage.read_bytes(location) == b"second" * 1000
    storage.delete(location)
    assert not storage.exists(location) and storage.read_bytes(location) is None
    storage.delete(location)  # nothing there: not an error


def test_a_local_write_that_fails_midway_keeps_the_previous_bytes(tmp_path, monkeypatch):
    location = tmp_path / "checkpoint.pt"
    storage.write_bytes_atomic(location, b"previous")

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "fsync", failing_fsync)  # the new bytes are written, not yet durable
    with pytest.raises(OSError, match="injected I/O error"):
        storage.write_bytes_atomic(location, b"next" * 1000)
    monkeypatch.undo()
    assert storage.read_bytes(location) == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left behind


class _UploaderDied(BaseException):
    """The uploading process dying: nothing catches it, nothing retries."""


class _CutOffBody:
    """A request body that gives half of its bytes, then the uploader dies."""

    def __init__(self, data: bytes):
        self.data, self.sent = data, 0

    def read(self, size: int = -1) -> bytes:
        half = len(self.data) // 2
        if self.sent >= half:
            raise _UploaderDied("the uploading process died halfway through the upload")
        chunk = self.data[self.sent:half if size < 0 else min(half, self.sent + size)]
        self.sent += len(chunk)
        return chunk


@S3
def test_an_s3_upload_cut_off_halfway_leaves_the_previous_object(bucket, moto):
    location = f"s3://{bucket}/run/checkpoint.pt"
    storage.write_bytes_atomic(location, b"previous")
    bodies: list[_CutOffBody] = []

    def cut_off(request, **kwargs):
        data = request.body if isinstance(request.body, bytes) else request.body.read()
        bodies.append(_CutOffBody(data))
        request.body = bodies[-1]

    events = storage.s3_client().meta.events
    events.register("before-send.s3.PutObject", cut_off)
    try:
        with pytest.raises(_UploaderDied):
            storage.write_bytes_atomic(location, b"next" * 100_000)
    finally:
        events.unregister("before-send.s3.PutObject", cut_off)
    assert bodies and bodies[0].sent == 200_000  # half of the upload went out
    assert storage.read_bytes(location) == b"previous"
    listed = moto.client("s3").list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in listed] == ["run/checkpoint.pt"]


@S3
def test_an_s3_write_that_fails_keeps_the_previous_object_and_names_the_code(bucket):
    location = f"s3://{bucket}/run/checkpoint.pt"
    storage.write_bytes_atomic(location, b"previous")
    fired = raise_on(storage.s3_client(), "PutObject", "InternalError", "We encountered an internal error",
                     when="before-call", service="s3")
    with pytest.raises(ProviderError, match=rf"writing {re.escape(location)} failed: .*InternalError"):
        storage.write_bytes_atomic(location, b"next")
    assert fired == [1]
    assert storage.read_bytes(location) == b"previous"


@S3
@pytest.mark.parametrize("operation", ["exists", "read_bytes", "write_bytes_atomic", "delete"])
def test_a_missing_bucket_is_a_clear_error(moto, operation):
    location = "s3://thrifty-no-such-bucket/run/checkpoint.pt"
    call = getattr(storage, operation)
    with pytest.raises(ProviderError, match=rf"{re.escape(location)} failed: .*NoSuchBucket"):
        call(location, b"data") if operation == "write_bytes_atomic" else call(location)


@S3
def test_denied_access_is_a_clear_error(bucket):
    location = f"s3://{bucket}/run/checkpoint.pt"
    raise_on(storage.s3_client(), "GetObject", "AccessDenied", "Access Denied", service="s3")
    denied = rf"reading {re.escape(location)} failed: .*AccessDenied.*lack this permission"
    with pytest.raises(ProviderError, match=denied):
        storage.read_bytes(location)


@S3
def test_one_client_per_process_from_the_standard_aws_environment(moto, monkeypatch):
    client = storage.s3_client()
    assert storage.s3_client() is client and client.meta.endpoint_url == moto.url
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert storage.s3_client() is not client and storage.s3_client().meta.region_name == "eu-west-1"
    # botocore reads the endpoint itself: the S3 one over the global one, the global one alone
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert storage.s3_client().meta.endpoint_url == moto.url
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    assert storage.s3_client().meta.endpoint_url == moto.url


def test_a_local_path_needs_no_boto3_and_s3_without_it_says_what_to_install(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.modules["boto3"] = None  # as if it were not installed
        from thrifty.core.errors import MissingDependencyError
        from thrifty.runtime.ddp import storage

        storage.write_bytes_atomic({str(tmp_path / "checkpoint.pt")!r}, b"local")
        assert storage.read_bytes({str(tmp_path / "checkpoint.pt")!r}) == b"local"
        assert "botocore" not in sys.modules, "botocore was imported for a local path"
        try:
            storage.exists("s3://bucket/checkpoint.pt")
        except MissingDependencyError as e:
            print(e)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'thrifty[aws]'" in done.stdout


# -- checkpoints --------------------------------------------------------------------------------

def test_a_checkpoint_round_trips_exactly(location):
    torch = pytest.importorskip("torch")
    from thrifty.runtime.ddp.checkpoint import load_checkpoint, save_checkpoint

    assert load_checkpoint(location) is None
    model = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.arange(5)}
    seconds, size = save_checkpoint(location, {"iteration": 7, "model": model})
    assert size == len(storage.read_bytes(location) or b"") and seconds >= 0
    state = load_checkpoint(location)
    assert state is not None and state["iteration"] == 7
    assert all(torch.equal(state["model"][name], tensor) for name, tensor in model.items())
    storage.write_bytes_atomic(location, b"not a checkpoint")
    with pytest.raises(ProblemError, match=rf"^{re.escape(storage.describe(location))}: cannot read checkpoint"):
        load_checkpoint(location)


@S3
def test_a_world_checkpoints_to_s3_and_resumes_from_it_bit_for_bit(bucket, tmp_path):
    torch = pytest.importorskip("torch")
    from thrifty.runtime.ddp.checkpoint import load_checkpoint
    from thrifty.runtime.training.launcher import RankSlot, Segment

    from test_training_runtime_processes import worker_pids

    def run(where: str, iterations: int, index: int) -> Segment:
        job = JobSpec(trainer=TINY, global_batch=16, iterations=iterations, batches=(5, 11), checkpoint_path=where,
                      checkpoint_every=4, timeout_s=60)
        slots = [RankSlot(r, f"m{r}", "local-a", "spot", "127.0.0.1", r, 0, 1, b) for r, b in enumerate((5, 11))]
        with Segment(job, slots, tmp_path, index, world_timeout_s=90, stall_timeout_s=90) as segment:
            segment.start()
            while (ended := segment.poll().ended) is None:
                time.sleep(0.02)
        assert ended == "finished"
        return segment

    remote, local = f"s3://{bucket}/run/checkpoint.pt", str(tmp_path / "checkpoint.pt")
    assert run(remote, 6, 0).last_checkpoint == 6  # rank 0 saved to S3
    assert run(remote, 12, 1).start_iteration == 6  # every rank loaded it from S3
    run(local, 12, 2)  # the same world, uninterrupted, on a local path
    resumed, uninterrupted = load_checkpoint(remote), load_checkpoint(local)
    assert resumed is not None and uninterrupted is not None and resumed["iteration"] == 12
    for name, tensor in uninterrupted["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    assert worker_pids() == []


@S3
def test_a_tuning_run_checkpoints_its_trials_to_s3_and_keeps_its_storage_when_resumed(bucket, tmp_path):
    pytest.importorskip("torch")
    from thrifty.runtime.ddp.checkpoint import load_checkpoint
    from thrifty.runtime.tuning.driver import tune

    spec = {"name": "s3", "trainer": "thrifty.runtime.tuning.executors.worlds:example_trainer",
            "search_space": {"lr": 0.3}, "samples": 1, "max_iterations": 2,
            "scheduler": "fifo", "resources": {"atoms": 1}, "iteration_timeout_s": 60}
    storage, out = f"s3://{bucket}/tuning", tmp_path / "out"
    result = tune(spec, out=out, storage=storage)
    assert [t.iteration for t in result.trials] == [2] and not any(t.error for t in result.trials)
    for trial in result.trials:  # the trial's final checkpoint is in the bucket, under the run's name
        state = load_checkpoint(f"{storage}/out/trial-{trial.trial_id}/checkpoint.pt")
        assert state is not None and state["iteration"] == 2 and state["trainer_args"] == trial.config
    assert not list(out.rglob("trials/**/checkpoint.pt"))  # none on this host's disk
    assert json.loads((out / "experiment.json").read_text())["storage"] == storage  # a resume reads it there
    assert (out / "best" / "checkpoint.pt").stat().st_size > 0  # the best one, copied beside its configuration
    with pytest.raises(ProblemError, match="^storage: .*resume it without --storage"):
        tune(resume=out, storage=f"s3://{bucket}/elsewhere")


@S3
def test_a_tuning_storage_in_a_missing_bucket_is_refused_before_the_run(moto, tmp_path):
    from thrifty.runtime.tuning.driver import tune

    spec = {"trainer": "thrifty.runtime.tuning.executors.worlds:example_trainer", "search_space": {"lr": 0.1},
            "samples": 1, "max_iterations": 1, "scheduler": "fifo", "storage": "s3://no-such-bucket-xyz/tuning"}
    with pytest.raises(ProviderError, match="NoSuchBucket"):
        tune(spec, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
