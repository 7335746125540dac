"""The one job entry (issue 34): a `JobSpec` reaches every rank of a training
job or a tuning trial one way, as JSON on the command line of
`thrifty.runtime.ddp.worker`; a bad job names the JSON path of its first
bad field. No process is started here."""

from __future__ import annotations

import json

import pytest

from thrifty.core.errors import ProblemError
from thrifty.runtime.ddp.job import JobSpec, WorkerFault
from thrifty.runtime.ddp.worker import ENTRY, _parse, job_argv

TRAINING = JobSpec(trainer="m:f", global_batch=24, iterations=10, batches=(8, 16), checkpoint_path="c.pt",
                   faults=(WorkerFault(1, "slow", 2, seconds=0.1),), machine_ids=("a", "b"))


def test_a_job_reaches_the_entry_as_json_and_comes_back_the_same():
    argv = job_argv(TRAINING)
    assert ENTRY == "thrifty.runtime.ddp.worker:main" and argv[0] == "--job"
    assert json.loads(argv[1])["batches"] == [8, 16]
    assert _parse(argv) == TRAINING


def test_the_entry_reads_a_kept_job_file_by_hand(tmp_path):
    path = tmp_path / "job-segment0.json"
    TRAINING.write(path)
    assert _parse(["--job", f"@{path}"]) == TRAINING


@pytest.mark.parametrize("change, path, says", [
    ({"faults": [{"rank": 1, "kind": "explode"}]}, "faults[0].kind", "'kill', 'notice'"),
    ({"faults": [{"rank": -1, "kind": "kill"}]}, "faults[0].rank", "at least 0"),
    ({"iterations": True}, "iterations", "valid integer"),  # a flag is not a number
    ({"evaluate": 1}, "evaluate", "valid boolean"),  # nor a number a flag
    ({"batches": [8, "16"]}, "batches[1]", "valid integer"),
    ({"batches": [0, 24]}, "batches[0]", "at least 1"),
    ({"timeout_s": float("inf")}, "timeout_s", "finite"),
    ({"checkpoint_every_s": 0}, "checkpoint_every_s", "greater than 0"),
    ({"trainer_argz": {}}, "trainer_argz", "not a known field"),
])
def test_a_bad_job_in_json_names_the_json_path(change, path, says):
    data = {**json.loads(TRAINING.to_json()), **change}
    with pytest.raises(ProblemError) as caught:
        JobSpec.from_json(json.dumps(data), source="--job")
    assert caught.value.path == path and says in caught.value.message
    assert str(caught.value).startswith(f"--job: {path}: ")


def test_a_job_file_that_is_not_a_job_says_so(tmp_path):
    path = tmp_path / "job.json"
    path.write_text("[1, 2]")
    with pytest.raises(ProblemError, match="a job must be a JSON object"):
        JobSpec.read(path)
    path.write_text('{"trainer": "m:f"')
    with pytest.raises(ProblemError, match="not valid JSON"):
        JobSpec.read(path)
    with pytest.raises(ProblemError, match="not valid JSON"):
        JobSpec.from_json("{trainer")


def test_a_bad_job_on_the_entry_line_is_bad_input_naming_its_field():
    with pytest.raises(ProblemError, match=r"^--job: checkpoint_path: is required but missing"):
        _parse(["--job", json.dumps({"trainer": "m:f", "iterations": 3})])


def test_a_job_is_frozen_and_changes_are_validated_again():
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        TRAINING.iterations = 3  # type: ignore[misc]
    assert TRAINING.with_changes(iterations=20).iterations == 20
    with pytest.raises(ProblemError) as caught:
        TRAINING.with_changes(global_batch=16)
    assert caught.value.path == "batches"
