"""`cascade run` records a real run: git state, params, seed, environment, metrics, into real MLflow."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from cascade_repro.manifest import Manifest
from tests.plugin import Project, git

pytestmark = pytest.mark.slow


def test_commit_and_dirty_state_round_trip(project: Project, tmp_path: Path) -> None:
    """The recorded commit is HEAD; patch + untracked files rebuild the dirty tree byte for byte."""
    project.write("data/blob.bin", bytes(range(256)) * 40)
    project.write("notes.txt", "line one\nline two\n")
    project.commit("add binary and text")
    head = git(project.root, "rev-parse", "HEAD").strip()
    # Dirty: a modified text file, a modified binary file, a deleted file, untracked text + binary.
    project.write("train.py", (project.root / "train.py").read_text() + "\n# tweak\n")
    project.write("data/blob.bin", bytes(reversed(range(256))) * 41)
    (project.root / "notes.txt").unlink()
    project.write("scratch/new_module.py", "VALUE = 1\n")
    project.write("scratch/weights.bin", b"\x00\xff\x10" * 500)

    result = project.cascade("run", "train.py", check=True)
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)

    assert manifest["git"]["commit"] == head
    assert run.data.tags["mlflow.source.git.commit"] == head
    assert manifest["git"]["dirty"] is True and run.data.tags["cascade.dirty"] == "true"
    untracked = {u["path"]: u for u in manifest["git"]["untracked"]}
    assert set(untracked) == {"scratch/new_module.py", "scratch/weights.bin"}
    weights = (project.root / "scratch/weights.bin").read_bytes()
    assert untracked["scratch/weights.bin"]["sha256"] == hashlib.sha256(weights).hexdigest()

    # Rebuild: clean clone at the commit, apply the recorded patch, add the recorded untracked files.
    rebuilt = tmp_path / "rebuilt"
    git(tmp_path, "clone", "-q", str(project.root), str(rebuilt))
    git(rebuilt, "checkout", "-q", head)
    client = project.client()
    downloads = Path(client.download_artifacts(run.info.run_id, "cascade", str(tmp_path / "dl")))
    patch = (downloads / "git.patch").read_bytes()
    assert hashlib.sha256(patch).hexdigest() == manifest["git"]["patch"]["sha256"]
    subprocess.run(["git", "apply", "--binary", "-"], cwd=rebuilt, input=patch, check=True)
    for rel in untracked:
        target = rebuilt / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(downloads / "untracked" / rel, target)

    def tree(root: Path) -> dict[str, bytes]:
        skip = (".git", "mlflow.db", "mlruns", ".cascade", "out")
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] not in skip
        }

    assert tree(rebuilt) == tree(project.root)
    assert "FINISHED" in result.stderr


def test_params_overrides_and_seed_are_what_the_script_saw(project: Project) -> None:
    project.cascade(
        "run", "--set", "optimizer.lr=0.05", "--add", "extra.flag=true", "--seed", "7",
        "train.py", "--points", "0", "--free-arg", "x",
    check=True)  # fmt: skip
    seen = json.loads((project.root / "out/seen.json").read_text())
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)

    assert seen["params"]["optimizer"]["lr"] == 0.05 and isinstance(seen["params"]["optimizer"]["lr"], float)
    assert seen["params"]["extra"] == {"flag": True}
    assert seen["params"]["seed"] == 7
    assert seen["argv"] == ["--points", "0", "--free-arg", "x"]
    assert seen["pythonhashseed"] == "7"
    assert seen["torch_initial_seed"] == 7
    assert run.data.params["optimizer.lr"] == "0.05"
    assert run.data.params["extra.flag"] == "true"
    assert run.data.params["seed"] == "7"
    assert manifest["params"]["seed"] == 7 and manifest["params"]["seed_source"] == "option"
    assert manifest["params"]["overrides"] == {"optimizer.lr": 0.05, "extra.flag": True}
    assert manifest["command"]["argv"] == ["--points", "0", "--free-arg", "x"]
    assert json.loads(run.data.tags["cascade.argv"]) == ["--points", "0", "--free-arg", "x"]


def test_default_seed_makes_two_runs_bitwise_identical(project: Project) -> None:
    project.cascade("run", "train.py", check=True)
    first = (project.root / "out/losses.json").read_text()
    project.cascade("run", "train.py", check=True)
    second = (project.root / "out/losses.json").read_text()
    project.cascade("run", "--seed", "11", "train.py", check=True)
    third = (project.root / "out/losses.json").read_text()
    assert first == second
    assert first != third
    runs = project.runs()
    seeds = sorted(project.manifest(r.info.run_id)["params"]["seed"] for r in runs)
    assert seeds == [3, 3, 11]  # 3 from hyperparameters.yaml, 11 from --seed
    # The metric history in MLflow carries the same bits as the script computed.
    client = project.client()
    newest_default = [r for r in runs if r.data.params["seed"] == "3"][0]
    history = sorted(client.get_metric_history(newest_default.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.value for m in history] == json.loads(first)


def test_environment_stack_and_redaction(project: Project) -> None:
    env = {
        "OMP_NUM_THREADS": "1",
        "MLFLOW_TRACKING_TOKEN": "hunter2-secret",
        "CUDA_API_KEY": "abc-secret-key",
        "UNLISTED_VARIABLE": "not recorded",
    }
    project.cascade("run", "train.py", env=env, check=True)
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)
    text = json.dumps(manifest)

    assert manifest["environment"]["OMP_NUM_THREADS"] == "1"
    assert manifest["environment"]["MLFLOW_TRACKING_TOKEN"] == "<redacted>"
    assert manifest["environment"]["CUDA_API_KEY"] == "<redacted>"
    assert "UNLISTED_VARIABLE" not in manifest["environment"]
    assert "hunter2-secret" not in text and "abc-secret-key" not in text
    assert manifest["torch"]["version"] == torch.__version__
    assert manifest["torch"]["git_version"] == torch.version.git_version
    assert manifest["torch"]["num_threads"] == 1  # OMP_NUM_THREADS=1 reached the script
    assert manifest["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert run.data.tags["cascade.torch"] == torch.__version__
    packages = manifest["python"]["packages"]
    for name in ("torch", "mlflow", "pyyaml", "click"):
        assert packages[name]["version"] == importlib.metadata.version(name)
    assert packages["cascade-repro"]["origin"] in ("editable", "direct", "archive")
    assert manifest["determinism"]["applied"]["torch.manual_seed"] == 3
    assert manifest["determinism"]["flags_at_start"]["deterministic_algorithms"] is True
    assert manifest["schema"] == "cascade.run/1"
    # the one way in and out: the typed record reads what was stored and writes it back unchanged
    typed = Manifest.from_dict(manifest)
    assert typed.to_dict() == manifest
    assert typed.torch.num_threads == 1 and typed.run_id == run.info.run_id
    assert typed.python.package_versions["torch"] == importlib.metadata.version("torch")


def test_stock_mlflow_ui_tags(project: Project) -> None:
    git(project.root, "remote", "add", "origin", "https://alice:ghp_secret@example.com/team/proj.git")
    project.cascade("run", "--name", "first-try", "train.py", check=True)
    run = project.only_run()
    tags = run.data.tags
    # The remote is recorded without its credentials, in the record and in MLflow's repoURL tag.
    assert tags["mlflow.source.git.repoURL"] == "https://example.com/team/proj.git"
    manifest = project.manifest(run.info.run_id)
    assert manifest["git"]["remotes"] == {"origin": "https://example.com/team/proj.git"}
    assert "ghp_secret" not in json.dumps(manifest) and "ghp_secret" not in json.dumps(tags)
    assert tags["mlflow.source.name"] == "train.py"
    assert tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.git.commit"] == git(project.root, "rev-parse", "HEAD").strip()
    assert tags["mlflow.user"]
    assert run.info.run_name == "first-try"
    assert run.info.status == "FINISHED"
    # Artifacts land beside mlflow.db at the repo root, where `mlflow ui` run there looks.
    assert run.info.artifact_uri.startswith((project.root / "mlruns").as_uri() + "/")
    log = project.client().download_artifacts(run.info.run_id, "cascade/output.log", str(project.root / ".o"))
    assert "trained 20 steps" in Path(log).read_text()


def test_untracked_file_over_the_limit_is_named_not_kept(project: Project) -> None:
    project.write("cascade.yaml", "untracked_max_bytes: 1000\n")
    project.commit("small limit")
    project.write("big.bin", b"\x01" * 5000)
    project.write("small.txt", "ok\n")
    result = project.cascade("run", "train.py", check=True)
    run = project.only_run()
    untracked = {u["path"]: u for u in project.manifest(run.info.run_id)["git"]["untracked"]}
    assert untracked["big.bin"]["stored"] is False
    assert untracked["big.bin"]["sha256"] == hashlib.sha256(b"\x01" * 5000).hexdigest()
    assert "dvc add" in untracked["big.bin"]["reason"]
    assert untracked["small.txt"]["stored"] is True
    assert "big.bin" in result.stderr and "dvc add" in result.stderr
    artifacts = {a.path for a in project.client().list_artifacts(run.info.run_id, "cascade/untracked")}
    assert artifacts == {"cascade/untracked/small.txt"}


def test_image_of_a_container_started_elsewhere_is_recorded(project: Project) -> None:
    """Kubernetes or a shell started the container: CASCADE_IMAGE names its image for the record."""
    image = "registry.example.com/team/train@sha256:" + "b" * 64
    image_id = "sha256:" + "c" * 64
    run_id = project.record("train.py", env={"CASCADE_IMAGE": image, "CASCADE_IMAGE_ID": image_id})
    container = project.manifest(run_id)["container"]
    assert container["in_container"] is True
    assert container["image"] == image and container["repo_digest"] == image
    assert container["image_id"] == "sha256:" + "c" * 64
    assert project.client().get_run(run_id).data.tags["cascade.image_id"] == "sha256:" + "c" * 64
