"""The command line through its entry point: exit codes, no tracebacks, output."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from thrifty.runtime.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("thrifty ")


def test_simulate_shipped_gpu_profile_json(capsys):
    assert main(["simulate", "--model", "resnet50", "--config", "4xp3.8xlarge@512+4xg4dn.8xlarge@32",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = out["prediction"]
    assert out["global_batch"] == 4 * 512 + 4 * 32
    assert p["world_size"] == 4 * 4 + 4 * 1 and p["instances"] == 8
    assert p["p95_s"] >= p["mean_s"] > p["forward_s"] > 0
    assert p["bandwidth_sources"] == {"g4dn.8xlarge": "derived", "p3.8xlarge": "derived"}


def test_simulate_local_uses_probed_allreduce(capsys):
    assert main(["simulate", "--model", "mlp", "--config", "local@16+local@48", "--json", "--apm"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prediction"]["bandwidth_sources"] == {"local": "learned"}
    assert out["prediction"]["world_size"] == 2
    assert out["apm"]["sd_s"] == 0.0


def test_simulate_human_output(capsys):
    assert main(["simulate", "--model", "mlp", "--config", "2xlocal@32"]) == 0
    out = capsys.readouterr().out
    assert "iteration mean" in out and "exposed communication" in out


def test_unknown_instance_type_exits_2_with_suggestion(capsys):
    assert main(["simulate", "--model", "resnet50", "--config", "2xp3.8xlrage@64"]) == 2
    err = capsys.readouterr().err
    assert "unknown instance type 'p3.8xlrage'" in err and "p3.8xlarge" in err
    assert "Traceback" not in err


def test_unknown_model_lists_available(capsys):
    assert main(["simulate", "--model", "resnet5O", "--config", "local@8"]) == 2
    err = capsys.readouterr().err
    assert "no compute profile for model 'resnet5O'" in err and "resnet50" in err


def test_batch_beyond_memory_exits_2(capsys):
    assert main(["simulate", "--model", "resnet50", "--config", "g4dn.xlarge@100000"]) == 2
    assert "beyond the memory limit" in capsys.readouterr().err


def test_console_script_runs_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "simulate", "--model", "nope",
                           "--config", "local@8"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "error:" in proc.stderr


def test_simulate_does_not_import_torch():
    code = ("import sys; from thrifty.runtime.cli import main; "
            "main(['simulate','--model','resnet50','--config','2xp3.8xlarge@256','--json']); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


HEAVY = ("xgboost", "sklearn", "pandas", "scipy.stats", "scipy.special", "torch", "ray", "boto3", "botocore",
         "matplotlib", "ortools", "z3",
         # the runtime's machinery: the parser builds every command's arguments (a cluster address parser
         # among them) and must not load providers, their events and the catalog's schema to do so (a merge
         # of issue 34 did: 80 ms of a 0.45 s solve); nor a profile bundle's reader for a shipped model
         "thrifty.runtime.providers.base", "thrifty.runtime.events", "thrifty.perfmodels.bundle")


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_solve_of_the_main_job_imports_no_heavy_package(extra):
    """`thrifty solve` on the README's main job, as the `thrifty` console script runs it: none of the packages
    that take a second to import (a learned allreduce model is evaluated in numpy, without xgboost)."""
    code = ("import sys, io, contextlib\n"
            "from thrifty.runtime.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    code = main(['solve', 'datasets/examples/heterogeneous-resnet50.json', *{extra!r}])\n"
            f"print(code, sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.strip() == "0 []", proc.stdout + proc.stderr


@pytest.mark.parametrize("kind,field", [
    ("catalog", "instance_types"), ("scaling-profile", "points"), ("compute-profile", "layers"),
    ("compute-model", "cv"),
])
def test_schema_of_each_data_file_format(kind, field, capsys):
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    top = schema["$defs"][schema["$ref"].rsplit("/", 1)[-1]] if "$ref" in schema else schema
    assert field in top["properties"] and top["additionalProperties"] is False


DEMO_SRIFTY54 = "datasets/examples/local-demo-srifty54.json"


def test_run_dry_run_prints_the_machines_and_prediction_and_starts_nothing(capsys, tmp_path, monkeypatch):
    import json
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    problem = str(Path(__file__).resolve().parents[1] / DEMO_SRIFTY54)
    zoo = ["--trainer", "thrifty.runtime.training.examples:zoo"]  # a dry run checks the trainer, as a run does
    assert main(["run", problem, "--dry-run", "--json", *zoo]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster_kind"] == "local" and out["config"] == "2xlocal-a@32"
    assert out["machines"] == [{"instance_type": "local-a", "market": "spot", "count": 2, "batch_per_machine": 32}]
    assert out["predicted_total_s"] > 0 and out["time_limit_s"] == 30
    assert out["provenance"]["local-a"]["compute"]["kind"] == "measured"  # the solved plan's own
    assert not (tmp_path / "thrifty-runs").exists()
    assert main(["run", problem, "--dry-run", *zoo]) == 0
    text = capsys.readouterr().out
    assert "2 x local-a (spot), batch 32 per machine" in text and "nothing was started" in text
    assert "local-b allreduce: measured (datasets/allreduce/local-gloo-model.json)" in text


def test_run_dry_run_refuses_the_plan_a_run_would_refuse(capsys, tmp_path, monkeypatch):
    """A dry run checks the plan against the problem as a run does (a review found it printed a plan whose
    batches did not add up, and a trainer that does not import, and exited 0)."""
    import json
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    problem = str(Path(__file__).resolve().parents[1] / DEMO_SRIFTY54)
    assert main(["solve", problem, "--out", "plan.json"]) == 0
    plan = json.loads(Path("plan.json").read_text())
    for change, where in (({"batch_per_instance": 7}, "allocation: places"), ({"count": 50}, "allocation[0].count"),
                          ({"instance_type": "g9.huge"}, "allocation[0]: g9.huge")):
        Path("bad.json").write_text(json.dumps({**plan, "allocation": [{**plan["allocation"][0], **change}]}))
        assert main(["run", "bad.json", "--problem", problem, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert f"bad.json: {where}" in err and "Traceback" not in err, err
    capsys.readouterr()
    assert main(["run", "plan.json", "--problem", problem, "--dry-run", "--trainer", "no_such_module_xyz:f"]) == 2
    assert "no_such_module_xyz" in capsys.readouterr().err
    assert main(["run", "plan.json", "--problem", problem, "--dry-run", "--trainer",
                 "thrifty.runtime.training.examples:zoo"]) == 0


def test_simulate_refuses_a_machine_count_no_account_has(capsys):
    assert main(["simulate", "--model", "resnet50", "--config", "99999999999xg5.12xlarge@8"]) == 2
    assert "count is" in capsys.readouterr().err


def test_run_with_a_cluster_it_does_not_know_is_bad_input(capsys):
    from pathlib import Path

    problem = str(Path(__file__).resolve().parents[1] / DEMO_SRIFTY54)
    assert main(["run", problem, "--dry-run", "--cluster", "somewhere"]) == 2
    err = capsys.readouterr().err
    assert "cluster: is 'somewhere', but must be 'local', 'auto', 'HOST:PORT'" in err and "Traceback" not in err
    assert main(["run", problem, "--dry-run", "--cluster", "missing.yaml"]) == 2
    assert "cluster config file missing.yaml does not exist" in capsys.readouterr().err


def test_run_dry_run_with_a_cluster_config_checks_it_and_starts_nothing(capsys, tmp_path):
    import json
    from pathlib import Path

    problem = str(Path(__file__).resolve().parents[1] / DEMO_SRIFTY54)
    config = tmp_path / "cluster.yaml"
    config.write_text("provider: ec2\nregion: us-east-1\nami: ami-0123456789abcdef0\nray_port: 6380\n")
    assert main(["run", problem, "--dry-run", "--json", "--cluster", str(config), "--trainer",
                 "thrifty.runtime.training.examples:zoo"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["cluster_kind"], out["provider"], out["region"], out["head"]) == \
        ("config", "ec2", "us-east-1", "this host:6380")
    config.write_text("provider: ec2\nregion: us-east-1\nami: ami-0123456789abcdef0\nhead_ip: 10.0.0\n")
    assert main(["run", problem, "--dry-run", "--cluster", str(config)]) == 2
    err = capsys.readouterr().err
    assert "head_ip" in err and "is not an IP address" in err and "Traceback" not in err


@pytest.mark.parametrize("name", COMMANDS)
def test_every_commands_help_lists_the_exit_codes_it_can_return(name, capsys):
    """Each from the one table (EXIT_CODES), 2 (bad input) and 130 (Ctrl-C) in every one."""
    from thrifty.runtime.commands._args import EXIT_CODES

    rows = exit_code_rows(name, capsys)
    listed = [line.split()[0] for line in rows]
    assert {"0", "2", "130"} <= set(listed) and set(listed) <= {str(c) for c in EXIT_CODES}
    for line in rows:
        code = line.split()[0]
        assert line.strip().startswith(f"{code} ") and EXIT_CODES[int(code)] in line, line


def exit_code_rows(name: str, capsys) -> list[str]:
    """The lines of the exit-code table of ``thrifty NAME --help``."""
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "\nexit codes:\n" in out
    return out.split("\nexit codes:\n", 1)[1].split("\n\n", 1)[0].splitlines()  # a paragraph may follow


def test_the_training_runtime_document_lists_the_exit_codes_of_run(capsys):
    """docs/training-runtime.md's table of exit codes is `thrifty run`'s, code for code."""
    listed = {int(line.split()[0]) for line in exit_code_rows("run", capsys)}
    text = (Path(__file__).resolve().parents[1] / "docs" / "training-runtime.md").read_text()
    table = text[text.index("Exit codes:"):].split("\n\n", 2)[1]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    assert documented == listed and {0, 1, 2, 3, 4, 130, 143} <= listed


def test_solve_help_says_the_problem_file_may_be_yaml(capsys):
    with pytest.raises(SystemExit):
        main(["solve", "--help"])
    out = capsys.readouterr().out
    assert "JSON or YAML" in out and "JSON problem file" not in out and "PROBLEM.json" not in out
    assert "3    infeasible" in out


def test_an_exit_code_outside_the_table_is_refused():
    from thrifty.runtime.commands._args import exit_codes_epilog

    with pytest.raises(ValueError, match=r"exit codes \[5\]"):
        exit_codes_epilog({0: "", 5: "no such code"})
