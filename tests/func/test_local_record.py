"""restore's fast path: a run found in the sqlite store without MLflow is the run MLflow resolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro.store import local_record, mlflow_store
from tests.plugin import Project

pytestmark = pytest.mark.slow


def test_local_store_resolves_as_mlflow_does_or_defers(project: Project) -> None:
    first = project.record("--tag", "v1", "--name", "alpha", "train.py")
    second = project.record("--name", "beta", "train.py")
    third = project.record("--name", "beta", "train.py")
    client = project.client()
    uri = project.tracking_uri
    for ref in ("v1", "alpha", first, first[:8], second[:6], third):
        found = local_record.find(uri, ref)
        assert found is not None, ref
        assert found.run_id == mlflow_store.resolve_run(client, ref, None).info.run_id
    assert local_record.find(uri, "v1").version == "v1"  # type: ignore[union-attr]
    record = json.loads((local_record.find(uri, "v1").artifact_dir / "cascade" / "run.json").read_text())  # type: ignore[union-attr]
    assert record["run_id"] == first
    # What it cannot answer exactly (unknown, ambiguous, deleted, another store) goes to MLflow.
    assert local_record.find(uri, "v2") is None
    assert local_record.find(uri, "beta") is None  # two runs have that name: MLflow's error names both
    client.delete_run(second)
    assert local_record.find(uri, second) is None
    assert local_record.find("http://127.0.0.1:5000", "v1") is None
    into = project.root.parent / "copied"
    into.mkdir()
    found = local_record.find(uri, first)
    assert found is not None
    copied = found.download_artifacts(first, "cascade/run.json", str(into))
    assert Path(copied) == into / "cascade" / "run.json"  # as MLflow: the artifact's path is kept
    assert json.loads(Path(copied).read_text())["run_id"] == first
    with pytest.raises(FileNotFoundError):
        found.download_artifacts(first, "../../mlflow.db", str(into))


READ_WITHOUT_MLFLOW = """
import sys
from cascade_repro.cli import main
from cascade_repro.cli.base import IN_PROCESS
try:
    main(sys.argv[1:], obj=IN_PROCESS)  # a finished `run` returns here instead of leaving by os._exit
except SystemExit as ended:
    code = ended.code
print("MLFLOW-IMPORTED" if "mlflow" in sys.modules else "NO-MLFLOW", code, file=sys.stderr)
"""


def test_read_commands_list_and_show_from_the_tables_as_mlflow_does(project: Project) -> None:
    """`ls`, `show`, `verify --no-record` and `diff` on the embedded store read MLflow's own tables and
    the artifact files, without importing MLflow; what they read is what MLflow's client says."""
    import math
    import subprocess
    import sys

    from cascade_repro.store.run_store import RunStore

    first = project.record("--tag", "v1", "--name", "alpha", "train.py")
    second = project.record("--name", "beta", "--set", "optimizer.lr=0.05", "train.py")
    project.client().log_metric(second, "nan_metric", math.nan)
    name = project.root.name
    fast, slow = RunStore(project.tracking_uri, name, fast_reads=True), RunStore(project.tracking_uri, name)
    assert fast._tables is not None and slow._tables is None
    for versions_only in (False, True):
        listed_fast, listed_slow = (
            fast.listed(versions_only=versions_only),
            slow.listed(versions_only=versions_only),
        )
        assert [r.run_id for r in listed_fast] == [r.run_id for r in listed_slow]
        for a, b in zip(listed_fast, listed_slow, strict=True):
            assert (a.name, a.status, a.start_ms, a.end_ms, a.artifact_uri, dict(a.tags)) == (
                b.name, b.status, b.start_ms, b.end_ms, b.artifact_uri, dict(b.tags)
            )  # fmt: skip
            assert {k: str(v) for k, v in a.metrics.items()} == {k: str(v) for k, v in b.metrics.items()}
            assert fast.experiment_name(str(a.experiment_id)) == name
    assert [r.run_id for r in fast.listed()] == [second, first]
    assert [r.run_id for r in fast.listed(versions_only=True)] == [first]
    assert math.isnan(fast.get(second).metrics["nan_metric"])
    for args, expected in (
        (["ls", "--json"], 0),
        (["show", "v1", "--json"], 0),
        (["verify", "--no-record", "v1", second], 3),  # a changed learning rate diverges
        (["diff", "v1", second, "--json"], 0),
    ):
        done = subprocess.run([sys.executable, "-c", READ_WITHOUT_MLFLOW, *args], cwd=project.root,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.stderr.strip().splitlines()[-1] == f"NO-MLFLOW {expected}", (args, done.stderr)
    shown = json.loads(project.invoke("show", "v1", "--json", check=True).stdout)["data"]
    assert shown["manifest"]["run_id"] == first and shown["status"] == "FINISHED"


def test_verify_records_its_verdict_without_mlflow_and_mlflow_reads_it(project: Project) -> None:
    """On the embedded store `cascade verify` writes its tags and report as MLflow would (the tags
    table, the artifact file), so it takes a fraction of a second; MLflow's client reads them back."""
    import subprocess
    import sys

    first = project.record("train.py")
    changed = project.record("--set", "optimizer.lr=0.05", "train.py")
    later = project.record("train.py")
    client = project.client()
    for against, expected, code in ((first, "BITWISE_IDENTICAL", 0), (changed, "DIVERGED", 3)):
        # the same run verified twice: the second verdict replaces the first one's tags
        done = subprocess.run([sys.executable, "-c", READ_WITHOUT_MLFLOW, "verify", against, later, "--json"],
                              cwd=project.root, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.stderr.strip().splitlines()[-1] == f"NO-MLFLOW {code}", done.stderr
        shown = json.loads(done.stdout)["data"]
        tags = client.get_run(later).data.tags
        assert (tags["cascade.verdict"], tags["cascade.verified_against"]) == (expected, against)
        report = client.download_artifacts(later, f"cascade/verify/{against}.json", str(project.root / ".dl"))
        assert json.loads(Path(report).read_text()) == shown
    artifacts = {a.path for a in client.list_artifacts(later, "cascade/verify")}
    assert artifacts == {f"cascade/verify/{first}.json", f"cascade/verify/{changed}.json"}


def test_a_version_is_given_and_moved_without_mlflow_as_mlflow_reads_it(project: Project) -> None:
    """`cascade tag` and `tag --force` on the embedded store write MLflow's tags table directly (in
    0.2 s rather than MLflow's import); MLflow's client and search read the labels and the move."""
    import subprocess
    import sys

    first, second = project.record("train.py"), project.record("train.py")
    tagging = ((["tag", first, "v1"], 0), (["tag", second, "v1"], 1), (["tag", second, "v1", "--force"], 0))
    for args, code in tagging:
        done = subprocess.run([sys.executable, "-c", READ_WITHOUT_MLFLOW, *args], cwd=project.root,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.stderr.strip().splitlines()[-1] == f"NO-MLFLOW {code}", (args, done.stderr)
    client = project.client()
    old, new = client.get_run(first).data.tags, client.get_run(second).data.tags
    assert "cascade.version" not in old and old["cascade.version_moved"].startswith(f"v1 → {second} at ")
    assert new["cascade.version"] == "v1" and new["cascade.version_moved_from"] == first
    found = client.search_runs([client.get_run(first).info.experiment_id], "tags.`cascade.version` = 'v1'")
    assert [run.info.run_id for run in found] == [second]
    # a label from someone else's record is shown, not obeyed: no forged line, no escape sequence
    client.set_tag(second, "cascade.version", "v1\x1b]0;owned\x07\nforged")
    refused = project.cascade("tag", second, "v2")
    assert refused.returncode == 1 and "is already version 'v1\\x1b]0;owned\\x07\\nforged'" in refused.stderr
    assert not any(line.startswith("forged") for line in refused.stderr.splitlines())


def test_a_run_is_recorded_without_mlflow_as_mlflow_records_it(project: Project) -> None:
    """On the embedded store, once its experiment exists, `cascade run` writes the run into MLflow's
    tables and artifact folder itself (MLflow's import would take ~2 s of CPU from the training); what
    MLflow's client then reads is what it reads of a run MLflow wrote."""
    import subprocess
    import sys

    first = project.record("--tag", "v1", "train.py")  # a new experiment: MLflow creates it
    before = {r.info.run_id for r in project.runs()}
    done = subprocess.run([sys.executable, "-c", READ_WITHOUT_MLFLOW, "run", "--tag", "v2", "train.py"],
                          cwd=project.root, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "NO-MLFLOW 0", done.stderr
    (second,) = {r.info.run_id for r in project.runs()} - before
    client = project.client()
    a, b = client.get_run(first), client.get_run(second)
    assert (b.info.status, b.info.experiment_id, b.info.user_id) == (a.info.status, a.info.experiment_id,
                                                                      a.info.user_id)  # fmt: skip
    assert b.info.start_time <= b.info.end_time and b.info.run_name
    assert b.data.params == a.data.params and len(a.data.params) > 3
    assert set(b.data.tags) == set(a.data.tags)
    for key in ("mlflow.source.git.commit", "mlflow.source.name", "mlflow.user", "cascade.dirty"):
        assert b.data.tags[key] == a.data.tags[key], key
    assert b.data.tags["cascade.version"] == "v2" and b.data.tags["mlflow.runName"] == b.info.run_name
    assert set(b.data.metrics) == set(a.data.metrics)
    assert {"loss", "lr"} <= set(a.data.metrics)
    for key in (k for k in a.data.metrics if not k.startswith("cascade.")):  # the script's: the same values
        history = [[(m.step, m.value) for m in client.get_metric_history(run, key)]
                   for run in (first, second)]  # fmt: skip
        assert history[0] == history[1], key
    listed = [sorted(x.path.replace(run, "RUN") for x in client.list_artifacts(run, "cascade"))
              for run in (first, second)]  # fmt: skip
    assert listed[0] == listed[1]
    assert project.manifest(second)["run_id"] == second
    verdict = json.loads(project.invoke("verify", "v1", "v2", "--json", check=True).stdout)["data"]
    assert verdict["verdict"] == "BITWISE_IDENTICAL"


def test_a_run_the_tables_cannot_give_now_is_read_through_mlflow_not_left_hollow(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run found, its row then unreadable (a writer's lock held past the timeout: simulated, it
    cannot be timed for real): resolve returned a run with no status, start or metrics, and verify
    sorted and judged on it. It asks MLflow instead."""
    from cascade_repro.store.local_record import LocalStore
    from cascade_repro.store.run_store import RunStore

    run_id = project.record("--tag", "v1", "train.py")
    store = RunStore(project.tracking_uri, project.root.name, fast_reads=True)
    monkeypatch.setattr(LocalStore, "run", lambda self, run_id: None)
    found = store.resolve("v1")
    assert (found.run_id, found.status) == (run_id, "FINISHED") and found.start_ms
