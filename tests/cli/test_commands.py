"""`cascade init`, `ls`, `show` and import hygiene, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.plugin import Project, git


def test_init_is_idempotent_and_keeps_user_files(project: Project) -> None:
    (project.root / "hyperparameters.yaml").write_text("seed: 9\nmine: true\n")
    first = project.invoke("init", check=True)
    assert "created  cascade.yaml" in first.stdout
    assert "kept     hyperparameters.yaml" in first.stdout
    assert (project.root / ".dvc" / "config").is_file()
    config_local = (project.root / ".dvc" / "config.local").read_text()
    assert "cascade-local" in config_local
    assert "cascade-local" not in (project.root / ".dvc" / "config").read_text()  # machine-specific path
    (project.root / "cascade.yaml").write_text("experiment: custom\n")
    gitignore = (project.root / ".gitignore").read_text()

    second = project.invoke("init", check=True)
    assert "kept     cascade.yaml" in second.stdout
    assert (project.root / "cascade.yaml").read_text() == "experiment: custom\n"
    assert (project.root / "hyperparameters.yaml").read_text() == "seed: 9\nmine: true\n"
    assert (project.root / ".gitignore").read_text() == gitignore  # no duplicate entries
    for entry in ("mlflow.db", "mlruns/", ".cascade/", "/checkpoints/"):
        assert gitignore.splitlines().count(entry) <= 1
        assert entry.rstrip("/").lstrip("/") in gitignore


def test_init_names_the_experiment_so_every_clone_records_into_it(project: Project, tmp_path) -> None:
    from cascade_repro.settings import load_settings

    clone = tmp_path / "another-name"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    assert load_settings(clone).experiment == "proj"  # the remote's repository name, not the directory's
    Project(clone).invoke("init", check=True)
    assert 'experiment: "proj"' in (clone / "cascade.yaml").read_text().splitlines()
    assert load_settings(clone).experiment == "proj"
    project.invoke("init", check=True)  # no remote: the directory's name, written down as well
    assert 'experiment: "proj"' in (project.root / "cascade.yaml").read_text().splitlines()


def test_init_outside_git(tmp_path) -> None:
    result = Project(tmp_path).invoke("init")
    assert result.returncode == 1 and "not inside a git repository" in result.stderr


@pytest.mark.slow
def test_ls_and_show_json_match_the_store(project: Project) -> None:
    project.cascade("run", "--name", "alpha", "train.py", check=True)
    project.cascade("run", "--name", "beta", "--set", "optimizer.lr=0.01", "train.py", check=True)
    listed = json.loads(project.invoke("ls", "--json", check=True).stdout)
    assert listed["schema"] == "cascade.cli/1"
    runs = {r["name"]: r for r in listed["data"]}
    assert set(runs) == {"alpha", "beta"}
    head = git(project.root, "rev-parse", "HEAD").strip()
    assert runs["beta"]["commit"] == head and runs["beta"]["status"] == "FINISHED"
    assert (
        runs["beta"]["metrics"]["loss"]
        == project.client().get_run(runs["beta"]["run_id"]).data.metrics["loss"]
    )
    assert runs["alpha"]["dirty"] is False

    shown = json.loads(project.invoke("show", "beta", "--json", check=True).stdout)["data"]
    assert shown["manifest"]["run_id"] == runs["beta"]["run_id"]
    assert shown["manifest"]["params"]["values"]["optimizer"]["lr"] == 0.01
    by_prefix = json.loads(project.invoke("show", runs["alpha"]["run_id"][:8], "--json", check=True).stdout)
    assert by_prefix["data"]["manifest"]["command"]["run_name"] == "alpha"

    table = project.invoke("ls", check=True).stdout
    assert runs["alpha"]["run_id"][:12] in table and "alpha" in table and head[:10] in table
    human = project.invoke("show", "alpha", check=True).stdout
    assert head in human and "optimizer.lr" in human and "seed" in human
    # piped (for grep, diff, a file): no line padded with spaces to the table's width
    assert [line for line in (human + table).splitlines() if line != line.rstrip()] == []
    # the command as typed, cascade's own options too (it showed `cascade run train.py` alone)
    assert "cascade run --set optimizer.lr=0.01 --name beta train.py" in project.invoke("show", "beta").stdout


def test_imports_load_no_heavy_module() -> None:
    """A script's `import cascade_repro`, the CLI and the child bootstrap stay light."""
    code = (
        "import sys, cascade_repro, cascade_repro.cli, cascade_repro.child.bootstrap\n"
        "heavy = {'mlflow', 'dvc', 'git', 'docker', 'torch', 'sqlalchemy', 'rich'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_names_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cascade_repro.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("init", "run", "ls", "show", "verify", "restore", "image", "diff", "check", "ui"):
        assert f"  {command}" in out


LOGS_THROUGH_MLFLOW = """\
import mlflow

import cascade_repro

for step, value in enumerate([0.9, 0.7, 0.8]):
    cascade_repro.log_metrics({"loss": 2 * value}, step=step)
    mlflow.log_metric("eval_loss", value, step=step)  # as HF's MLflowCallback: into the cascade run
mlflow.log_metrics({"epoch": 2.5, "grad_norm": 0.25}, step=3)
"""


def test_diff_compares_the_metrics_the_script_logged_through_mlflow_itself(project: Project) -> None:
    """`cascade diff` compared only cascade's summary: a framework logger's eval_loss never showed."""
    scaled = LOGS_THROUGH_MLFLOW.replace("value, step=step)", "value * SCALE, step=step)")
    # (SCALE from the environment: the same commit, clean, for both runs)
    scale = "import os\nimport mlflow\n\nSCALE = float(os.environ['SCALE'])\n"
    scaled = scaled.replace("import mlflow\n", scale)
    project.write("logs.py", scaled)
    project.commit("a script logging through mlflow")
    a = project.record("logs.py", env={"SCALE": "1"})
    b = project.record("logs.py", env={"SCALE": "2"})
    data = json.loads(project.cascade("diff", a, b, "--json", check=True).stdout)["data"]
    (metrics,) = [s for s in data["sections"] if s["name"] == "metrics"]
    changes = {c["key"]: (c["a"], c["b"]) for c in metrics["changes"]}
    assert changes == {"eval_loss (last)": (0.8, 1.6)}  # epoch and grad_norm equal, loss through cascade too
    shown = project.cascade("diff", a, b, check=True).stdout
    assert "eval_loss (last)" in shown


def _metrics_table(shown: str) -> dict[str, list[str]]:
    """The rows of `cascade show`'s metrics table: key → its cells (last, min, max, points)."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "metrics")
    assert lines[start + 1].split() == ["key", "last", "min", "max", "points"]
    rows = {}
    for line in lines[start + 2 :]:
        cells = line.split()
        if not cells or not (cells[0][0].isalpha()) or len(cells) > 5:
            break
        rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_show_lists_the_metrics_the_script_logged_through_mlflow_itself(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framework's own MLflow logger (HF's MLflowCallback, Lightning's MLFlowLogger) writes into the
    cascade run past `cascade_repro.log_metrics`: `show` lists its metrics with their last values,
    read from the embedded store's tables as through MLflow's client (a server, a file store)."""
    project.write("logs.py", LOGS_THROUGH_MLFLOW)
    project.commit("a script logging through mlflow")
    run_id = project.record("logs.py")
    fast = project.invoke("show", run_id, check=True).stdout
    rows = _metrics_table(fast)
    assert rows["loss"] == ["1.6", "1.4", "1.8", "3"]  # through cascade: its summary
    assert (rows["eval_loss"][0], rows["epoch"][0], rows["grad_norm"][0]) == ("0.8", "2.5", "0.25")
    assert "cascade.peak_rss_mb" in rows
    assert list(rows)[-1] == "cascade.peak_rss_mb"  # the script's own metrics first
    from cascade_repro.store import local_record

    monkeypatch.setattr(local_record.LocalStore, "open", classmethod(lambda cls, uri, environ: None))
    through_mlflow = project.invoke("show", run_id, check=True).stdout
    assert _metrics_table(through_mlflow) == rows
