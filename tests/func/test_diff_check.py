"""`cascade diff` and `cascade check` on real runs (records edited where another machine is needed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from cascade_repro import file_hashes
from cascade_repro.file_hashes import RACY_S
from cascade_repro.settings import ProjectPaths
from tests.plugin import Project, git

pytestmark = pytest.mark.slow


def _edit_record(project: Project, run_id: str, edit: Any) -> None:
    """Stand in for a run made on another machine: rewrite its stored record."""
    path = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade" / "run.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def _diff(project: Project, *args: str) -> dict[str, Any]:
    result = project.cascade("diff", *args, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["data"])


def test_diff_shows_exactly_what_differs_in_class_order(project: Project) -> None:
    a = project.record("train.py")
    project.write("train.py", (project.root / "train.py").read_text() + "# a later commit\n")
    project.commit("later")
    b = project.record("--set", "optimizer.lr=0.05", "train.py")
    numpy_a = project.manifest(a)["python"]["packages"]["numpy"]["version"]
    _edit_record(project, b, lambda r: r["python"]["packages"]["numpy"].update(version="1.0.0"))
    data = _diff(project, a, b)
    changed = {s["name"]: s for s in data["sections"] if s["changes"]}
    assert list(changed) == ["code", "params", "packages", "metrics", "trace"]  # class B first, results last
    assert [c["key"] for c in changed["code"]["changes"]] == ["commit"]
    assert "train.py | 1 +" in changed["code"]["changes"][0]["note"]
    assert [(c["key"], c["a"], c["b"]) for c in changed["params"]["changes"]] == [("optimizer.lr", 0.1, 0.05)]
    assert [(c["key"], c["a"], c["b"]) for c in changed["packages"]["changes"]] == [
        ("numpy", numpy_a, "1.0.0")
    ]
    assert changed["trace"]["changes"][0]["note"].startswith("DIVERGED at step 0")
    assert not any(s["changes"] for s in data["sections"] if s["name"] in ("stack", "environment", "seed"))
    only = _diff(project, a, b, "--only", "params")
    assert [s["name"] for s in only["sections"]] == ["params"]
    human = project.cascade("diff", a, b, "--log-to", b)
    assert human.returncode == 0 and "optimizer.lr" in human.stdout and "class B" in human.stdout
    logged = project.client().list_artifacts(b, "cascade/diff")
    assert [Path(f.path).name for f in logged] == [f"{a[:12]}-{b[:12]}.json"]
    bad = project.cascade("diff", a, b, "--only", "nonsense")
    assert bad.returncode == 2 and "unknown section" in bad.stderr


def test_diff_against_current_sees_the_working_tree(project: Project) -> None:
    a = project.record("train.py")
    project.write(
        "hyperparameters.yaml", (project.root / "hyperparameters.yaml").read_text().replace("0.1", "0.2")
    )
    data = _diff(project, a, "current")
    changed = {s["name"]: s for s in data["sections"] if s["changes"]}
    assert set(changed) == {"code", "params"}
    assert [c["key"] for c in changed["code"]["changes"]] == ["patch"]  # same commit, now dirty
    assert changed["params"]["changes"][0]["b"] == 0.2


def test_check_names_class_a_fields_and_what_stops_a_run(project: Project) -> None:
    same = project.record("train.py")
    result = project.cascade("check", same, "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["data"]["verdict"] == "BITWISE_REPRODUCIBLE"

    other_torch = project.record("train.py")
    _edit_record(project, other_torch, lambda r: r["torch"].update(version="2.99.0+cpu"))
    result = project.cascade("check", other_torch, "--json")
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)["data"]
    assert report["verdict"] == "WITHIN_TOLERANCE_ONLY"
    assert [f["summary"] for f in report["findings"]] == [
        f"torch.version: 2.99.0+cpu recorded, {project.manifest(same)['torch']['version']} here"
    ]

    gpu = project.record("train.py")
    _edit_record(project, gpu, lambda r: r["hardware"].update(gpus=[{"name": "NVIDIA H200"}]))
    result = project.cascade("check", gpu)
    assert result.returncode == 1 and "NOT_RUNNABLE" in result.stdout and "NVIDIA H200" in result.stdout

    assert project.cascade("check", "no-such-run").returncode == 1


def test_check_says_not_runnable_where_restore_would_refuse_an_input_the_checkout_changed(
    project: Project,
) -> None:
    """Found on nanoGPT: its data files are ignored by git; with train.bin changed, `cascade check v1`
    said BITWISE_REPRODUCIBLE (exit 0) while `cascade restore v1` refused to re-run without the bytes
    the run read."""
    project.write("reads.py", "print(len(open('data/train.bin', 'rb').read()))\n")
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "data/\n")
    (project.root / "data").mkdir()
    (project.root / "data" / "train.bin").write_bytes(b"tokens " * 100)
    project.commit("reads ignored data")
    run_id = project.record("reads.py")
    ok = project.cascade("check", run_id, "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["data"]["verdict"] == "BITWISE_REPRODUCIBLE"
    (project.root / "data" / "train.bin").write_bytes(b"other tokens " * 100)
    changed = project.cascade("check", run_id, "--json")
    assert changed.returncode == 1, changed.stderr
    report = json.loads(changed.stdout)["data"]
    assert report["verdict"] == "NOT_RUNNABLE"
    (finding,) = [f for f in report["findings"] if "data/train.bin" in f["summary"]]
    assert "changed since the run" in finding["summary"] and "--track-inputs" in finding["fix"]
    refused = project.cascade("restore", run_id)  # the same finding, the same word as restore
    assert refused.returncode != 0 and finding["summary"] in " ".join(refused.stderr.split()), refused.stderr


def test_diff_shows_the_argument_that_differs_in_a_long_command(project: Project) -> None:
    """Found on nanoGPT: runs differing by one added `--learning_rate=0.002` showed two argv cells cut
    to the same first 57 characters; the one hyperparameter change was invisible."""
    project.write("args.py", "import sys\nprint(sys.argv[1:])\n")
    project.commit("takes any arguments")
    common = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=2",
              "--log_interval=1", "--block_size=32", "--batch_size=4"]  # fmt: skip
    first = project.record("args.py", *common)
    second = project.record("args.py", *common, "--learning_rate=0.002")
    shown = project.cascade("diff", first, second)
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if line.split()[1:2] == ["argv"]]
    assert '"--learning_rate=0.002"' in row and "7 same" in row, row


def test_the_commits_diffstat_is_one_line_in_the_table(project: Project) -> None:
    """Found on nanoGPT: the commit row's note printed git's stat with a literal \\n between its lines."""
    first = project.record("train.py")
    project.write("NOTES.md", "one line\n")
    project.commit("notes")
    second = project.record("train.py")
    shown = project.cascade("diff", first, second)
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if line.split()[1:2] == ["commit"]]
    assert "NOTES.md | 1 +; 1 file changed, 1 insertion(+)" in row and "\\n" not in row, row


def test_check_without_a_run_checks_this_machine(project: Project) -> None:
    project.cascade("init", check=True)
    project.commit("cascade init")
    result = project.cascade("check", "--json")
    assert result.returncode == 0, result.stdout
    findings = json.loads(result.stdout)["data"]["findings"]
    names = [f["summary"].split(":")[0] for f in findings]
    assert {"git", "MLflow store", "DVC remote", "torch"} <= set(names)
    assert git(project.root, "status", "--porcelain") == ""


def test_records_of_another_schema_and_runs_of_another_experiment(project: Project) -> None:
    a = project.record("train.py")
    b = project.record("--experiment", "elsewhere", "train.py")
    data = _diff(project, a, b)
    assert data["notes"] == [f"the runs belong to different experiments: {project.root.name} and elsewhere"]
    _edit_record(project, b, lambda r: r.update(schema="cascade.run/9"))
    newer = project.cascade("diff", a, b)
    assert newer.returncode == 1 and "schema cascade.run/9 is not one this cascade reads" in newer.stderr
    assert "upgrade cascade" in newer.stderr


def test_check_reads_an_unchanged_ignored_input_once_not_at_every_call(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left from the last stop: `cascade check RUN` (and restore) hashed a run's ignored inputs at
    every call, and every `cascade run` at its end: ~10 s each for nanoGPT's 17 GB train.bin. Hashed
    once, the file is known by its stat while it stays as it was."""
    size = 8 << 20
    project.write("reads.py", "print(len(open('data/train.bin', 'rb').read()))\n")
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "data/\n")
    (project.root / "data").mkdir()
    data = project.root / "data" / "train.bin"
    data.write_bytes(os.urandom(size))
    project.commit("reads ignored data")
    time.sleep(RACY_S + 0.1)  # (a file changed within the file system's last tick is hashed every time)
    run_id = project.record("reads.py")
    assert str(data.resolve()) in ProjectPaths(project.root).file_hashes.read_text()  # kept by the run's end

    read: list[int] = []  # what check reads to hash (file_hashes' own reader, counted)
    real_read = file_hashes._read
    monkeypatch.setattr(file_hashes, "_read", lambda handle: read.append(1) or real_read(handle))
    for _ in range(2):
        ok = project.invoke("check", run_id, "--json")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["data"]["verdict"] == "BITWISE_REPRODUCIBLE"
    assert read == []  # train.bin was not read again

    stat = data.stat()  # one byte changed, its size and mtime as they were
    with open(data, "r+b") as handle:
        handle.seek(size // 2)
        handle.write(b"\0" if handle.read(1) != b"\0" else b"\1")
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = project.invoke("check", run_id, "--json")
    assert changed.returncode == 1, changed.stderr
    assert json.loads(changed.stdout)["data"]["verdict"] == "NOT_RUNNABLE" and read == [1]
