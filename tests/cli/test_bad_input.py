"""Bad input: a clear message naming the fix, the right exit code, and nothing half-written."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.plugin import Project, git


def _nothing_recorded(project: Project) -> None:
    assert project.runs() == []
    assert not (project.root / "out").exists(), "the script must not have started"
    runs_dir = project.root / ".cascade" / "runs"
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_not_a_git_repository(project: Project, tmp_path: Path) -> None:
    elsewhere = tmp_path / "plain"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text("print('hi')\n")
    result = Project(elsewhere).invoke("run", "train.py")
    assert result.returncode == 1
    assert "not inside a git repository" in result.stderr and "git init" in result.stderr


def test_repository_without_commit(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    root.mkdir()
    git(root, "init", "-q")
    (root / "train.py").write_text("print('hi')\n")
    result = Project(root).invoke("run", "train.py")
    assert result.returncode == 1
    assert "no commit yet" in result.stderr and "git commit" in result.stderr


def test_script_not_found(project: Project) -> None:
    result = project.invoke("run", "trian.py")
    assert result.returncode == 2
    assert "script not found: trian.py" in result.stderr
    _nothing_recorded(project)


def test_malformed_yaml_names_file_and_line(project: Project) -> None:
    project.write("hyperparameters.yaml", "seed: 1\noptimizer:\n  lr: 0.1\n   momentum: [0.9\n")
    result = project.invoke("run", "train.py")
    assert result.returncode == 1
    assert "malformed YAML in" in result.stderr and "hyperparameters.yaml:4" in result.stderr
    _nothing_recorded(project)


def test_malformed_cascade_yaml(project: Project) -> None:
    project.write("cascade.yaml", "determinism: sometimes\n")
    result = project.invoke("run", "train.py")
    assert result.returncode == 1
    assert "cascade.yaml: determinism is 'sometimes'; expected off, warn or strict" in result.stderr
    _nothing_recorded(project)
    project.write("cascade.yaml", "trace_grads: sometimes\n")
    result = project.invoke("run", "train.py")
    assert result.returncode == 1
    assert "cascade.yaml: trace_grads is 'sometimes'; expected true, false or auto" in result.stderr
    _nothing_recorded(project)


def test_unknown_override_key_names_the_closest(project: Project) -> None:
    result = project.invoke("run", "--set", "optimiser.lr=0.2", "train.py")
    assert result.returncode == 2
    assert "no such key" in result.stderr and "did you mean optimizer.lr?" in result.stderr
    assert "--add optimiser.lr" in result.stderr
    _nothing_recorded(project)


def test_unreachable_store(project: Project) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    result = project.invoke("run", "train.py", env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert result.returncode == 1
    assert "unreachable" in result.stderr and "MLFLOW_TRACKING_URI" in result.stderr
    _nothing_recorded(project)


def test_require_clean_refuses_a_dirty_tree(project: Project) -> None:
    project.write("train.py", (project.root / "train.py").read_text() + "# edit\n")
    result = project.invoke("run", "--require-clean", "train.py")
    assert result.returncode == 1
    assert "uncommitted changes (train.py)" in result.stderr and "commit or stash" in result.stderr
    _nothing_recorded(project)


@pytest.mark.slow
def test_require_clean_accepts_a_clean_tree_and_show_suggests_close_ids(project: Project) -> None:
    project.cascade("run", "--require-clean", "train.py", check=True)
    run_id = project.only_run().info.run_id
    typo = run_id[:-1] + ("0" if run_id[-1] != "0" else "1")
    result = project.invoke("show", typo)
    assert result.returncode == 1
    assert f"no run '{typo}'" in result.stderr and f"did you mean {run_id}" in result.stderr


def test_bad_seed_is_a_usage_error(project: Project) -> None:
    result = project.invoke("run", "--seed", "abc", "train.py")
    assert result.returncode == 2 and "--seed must be an integer or 'random'" in result.stderr
    _nothing_recorded(project)


def test_track_inputs_without_dvc_is_refused_before_the_script_starts(project: Project) -> None:
    """Found on pytorch/examples' time_sequence_prediction (its traindata.pt is generated, ignored by
    git): `--track-inputs` in a project without `dvc init` ran the whole script, then said at the end
    that it could not keep what it read, and exited 0. Now nothing runs, and the fix is named."""
    result = project.invoke("run", "--track-inputs", "train.py")
    assert result.returncode == 2, result.stderr
    assert "--track-inputs keeps the files a run reads in the DVC cache; this project has no" in result.stderr
    assert "`cascade init`" in result.stderr and "without --track-inputs" in result.stderr
    _nothing_recorded(project)


def test_a_run_not_made_by_cascade_is_named_as_such(project: Project) -> None:
    client = project.client()
    experiment = client.create_experiment("plain", artifact_location=(project.root / "mlruns").as_uri())
    foreign = client.create_run(experiment).info.run_id
    for command in (["show", foreign], ["verify", foreign, foreign]):
        result = project.invoke(*command)
        assert result.returncode == 1
        assert f"run {foreign} has no cascade record" in result.stderr
        assert "not made by `cascade run`" in result.stderr


# -- hostile and mistyped YAML (issue 18: defects 3 and 9) ---------------------------------------------

LAUGHS = "l0: &l0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)
)  # 9**9 values from a few hundred bytes: once a 301 MB run record and a 164 s run


def test_alias_bomb_is_refused_before_the_script_starts(project: Project) -> None:
    assert len(LAUGHS) < 400
    project.write("hyperparameters.yaml", LAUGHS)
    started = time.monotonic()
    result = project.cascade("run", "train.py", timeout=60)
    assert time.monotonic() - started < 50  # (a loaded machine; the bomb itself never ends)
    assert result.returncode == 1
    assert "hyperparameters.yaml:" in result.stderr and "more than 100,000 values" in result.stderr
    assert "aliases" in result.stderr and "hint:" in result.stderr
    _nothing_recorded(project)


def test_alias_bombs_in_cascade_yaml_and_overrides_are_refused(project: Project) -> None:
    nested = "".join(f"  - {line}" for line in LAUGHS.splitlines(True))
    project.write("cascade.yaml", "key_metrics:\n" + nested)
    result = project.cascade("run", "train.py", timeout=60)
    assert result.returncode == 1 and "cascade.yaml:" in result.stderr
    assert "more than 100,000 values" in result.stderr
    (project.root / "cascade.yaml").unlink()
    bomb = "&a [x,x,x,x,x,x,x,x,x,x]"
    for level in range(1, 6):  # 10**6 values in one --set value
        bomb = f"[{bomb}," + ",".join([f"*{chr(96 + level)}"] * 9) + "]"
        bomb = f"&{chr(97 + level)} {bomb}" if level < 5 else bomb
    result = project.cascade("run", "--set", f"steps={bomb}", "train.py", timeout=60)
    assert result.returncode == 2 and "--set steps (&e): more than 100,000 values" in result.stderr
    _nothing_recorded(project)


def test_aliased_mappings_past_the_param_limit_are_refused(project: Project) -> None:
    # Four levels of 10 mapping aliases: 11,110 params (a 475-byte one logged 27,900 for 300 s).
    text = "k0: &k0 {" + ", ".join(f"a{i}: {i}" for i in range(10)) + "}\n"
    for level in range(1, 4):
        text += f"k{level}: &k{level} {{" + ", ".join(f"b{i}: *k{level - 1}" for i in range(10)) + "}\n"
    project.write("hyperparameters.yaml", text)
    result = project.cascade("run", "train.py", timeout=60)
    assert result.returncode == 1
    assert "hyperparameters.yaml holds 11,110 params (flattened keys)" in result.stderr
    assert "cascade takes at most 1,000" in result.stderr
    _nothing_recorded(project)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("hyperparameters.yaml", "seed: 1\nloop: &a [1, *a]\n", "hyperparameters.yaml:2: &a contains itself"),
        ("cascade.yaml", "docker: &d {network: *d}\n", "cascade.yaml:1: &d contains itself"),
        ("hyperparameters.yaml", b"\x89PNG\r\n\x1a\n\x00\x00", "hyperparameters.yaml:1: not UTF-8 text"),
        ("cascade.yaml", b"experiment: a\ndvc: {remote: \x00}\n", "cascade.yaml:2: character U+0000 is"),
        ("cascade.yaml", "determinism: warn\n  trace_interval: 5\n", "malformed YAML in"),
    ],
)
def test_recursive_binary_and_malformed_yaml_name_file_and_line(
    project: Project, name: str, content: str | bytes, message: str
) -> None:
    project.write(name, content)
    result = project.invoke("run", "train.py")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "run with -v for the traceback" not in result.stderr  # a named error, not a generic one
    _nothing_recorded(project)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("metrics_flush_s: abc", "cascade.yaml: metrics_flush_s is 'abc'; expected a number of seconds > 0"),
        ("key_metrics: 5", "cascade.yaml: key_metrics is 5; expected a list of metric names"),
        ("docker: 'yes'", "cascade.yaml: docker is 'yes'; expected a mapping of docker settings"),
        ("trace_interval: -1", "cascade.yaml: trace_interval is -1; expected a whole number of steps >= 0"),
    ],
)
def test_mistyped_settings_name_file_key_value_and_the_expected(
    project: Project, setting: str, message: str
) -> None:
    project.write("cascade.yaml", setting + "\n")
    result = project.invoke("run", "train.py")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    _nothing_recorded(project)


def test_negative_trace_interval_option_is_a_usage_error(project: Project) -> None:
    result = project.invoke("run", "--trace-interval", "-1", "train.py")
    assert result.returncode == 2 and "--trace-interval must be 0 (no trace) or a positive" in result.stderr
    _nothing_recorded(project)


def test_seed_out_of_range_is_refused_before_the_script_starts(project: Project) -> None:
    result = project.invoke("run", "--seed", "99999999999999999999999", "train.py")
    assert result.returncode == 2
    assert f"--seed 99999999999999999999999 is out of range; expected an integer from 0 to {2**64 - 1}" in (
        result.stderr
    )
    _nothing_recorded(project)
    project.write("hyperparameters.yaml", "seed: -7\nsteps: 2\noptimizer: {lr: 0.1, momentum: 0.9}\n")
    result = project.invoke("run", "train.py")
    assert result.returncode == 1
    assert "hyperparameters.yaml: seed is -7; expected an integer from 0" in result.stderr
    _nothing_recorded(project)


@pytest.mark.slow
def test_the_largest_seed_reaches_torch_and_numeric_keys_reach_the_script(project: Project) -> None:
    project.write(
        "hyperparameters.yaml",
        "seed: 3\nsteps: 3\noptimizer: {lr: 0.1, momentum: 0.9}\nmodel: {hidden: 4}\n"
        "layers: {1: 64, all: 3}\n",
    )
    project.commit("numeric keys")
    run_id = project.record("--seed", str(2**64 - 1), "train.py")
    seen = json.loads((project.root / "out" / "seen.json").read_text())
    assert seen["torch_initial_seed"] == 2**64 - 1
    assert seen["params"]["layers"] == {"1": 64, "all": 3}
    assert project.manifest(run_id)["params"]["seed"] == 2**64 - 1


@pytest.mark.parametrize(
    ("raised", "said"), [(RuntimeError(), "RuntimeError"), (KeyError("k"), "KeyError: 'k'")]
)
def test_an_unexpected_error_is_one_line_without_a_colon_where_it_has_no_message(
    project: Project, monkeypatch: pytest.MonkeyPatch, raised: Exception, said: str
) -> None:
    from cascade_repro import api

    def fails(**_: object) -> None:
        raise raised

    monkeypatch.setattr(api, "list_runs", fails)
    result = project.invoke("ls")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == f"cascade: error: {said}", result.stderr
