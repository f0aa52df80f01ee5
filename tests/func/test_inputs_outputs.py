"""Files git cannot see (issue 14.6) and files the run writes into the repository (issue 14.7).

A nanoGPT-style script reads prepared data that its `.gitignore` excludes: the record names each such
input (path, size, sha256), the run says how to track it, and `restore` takes it from the checkout
where it is unchanged, from the DVC cache with `--track-inputs`, and otherwise refuses before it
starts. What the run writes into the repository (its redirected output, `out/`) is an output, never
an untracked input whose snapshot then fails its own hash.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.plugin import CASCADE, Project

pytestmark = pytest.mark.slow

NANO = """\
import os
import pickle
from pathlib import Path

import numpy as np
import torch

if (Path(os.environ["HOME"]) / "crash-now").exists():  # outside the repository: not an input
    print("last words before the crash", flush=True)
    raise RuntimeError("boom on purpose")
with open("data/meta.pkl", "rb") as handle:
    meta = pickle.load(handle)
data = np.memmap("data/train.bin", dtype=np.uint16, mode="r")
torch.manual_seed(1337)
block, vocab = 8, meta["vocab_size"]
embed = torch.nn.Embedding(vocab, 16)
model = torch.nn.Sequential(embed, torch.nn.Flatten(), torch.nn.Linear(16 * block, vocab))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(5):
    ix = torch.randint(len(data) - block - 1, (4,))
    x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
    y = torch.from_numpy(np.array([data[i + block] for i in ix], dtype=np.int64))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("final loss", loss.item())
"""

WRITER = """\
import time
from pathlib import Path

import torch

out = Path("out")
out.mkdir(exist_ok=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(8, 4)
with open(out / "metrics.txt", "w") as metrics:
    for step in range(30):  # ~3 s of output while the parent captures the work tree
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics.write(f"{step} {loss.item()}\\n")
        metrics.flush()
        print("step", step, "loss", loss.item(), flush=True)
        time.sleep(0.1)
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _restore(project: Project, *args: str) -> tuple[int, dict[str, Any], str]:
    result = project.cascade("restore", *args, "--json")
    data = json.loads(result.stdout)["data"] if result.stdout.strip() else {}
    return result.returncode, data, result.stderr


@pytest.fixture
def nano(project: Project) -> Project:
    """nanoGPT's layout: prepared data under data/, excluded by the project's own .gitignore."""
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "*.bin\n*.pkl\n")
    project.write("train_nano.py", NANO)
    project.commit("nanoGPT-style script")
    (project.root / "data").mkdir()
    tokens = np.random.default_rng(0).integers(0, 32, 4096, dtype=np.uint16)
    tokens.tofile(project.root / "data" / "train.bin")
    import pickle

    (project.root / "data" / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 32}))
    return project


# -- 14.6: inputs git cannot see --------------------------------------------------------------------


def test_ignored_inputs_are_recorded_warned_about_and_restored_from_the_checkout(nano: Project) -> None:
    project = nano
    result = project.cascade("run", "--tag", "v1", "train_nano.py")
    assert result.returncode == 0, result.stderr
    run_id = project.only_run().info.run_id
    record = project.manifest(run_id)
    data = project.root / "data"
    assert record["inputs"] == [
        {"path": "data/meta.pkl", "size": (data / "meta.pkl").stat().st_size,
         "sha256": _sha256(data / "meta.pkl")},
        {"path": "data/train.bin", "size": 8192, "sha256": _sha256(data / "train.bin")},
    ]  # fmt: skip
    assert record["git"]["untracked"] == []  # ignored files are inputs, not dirty state
    assert "train_nano.py" not in json.dumps(record["inputs"])  # tracked files are not listed
    warning = " ".join(result.stderr.split())
    assert "neither git nor DVC tracks" in warning
    assert "dvc add data/meta.pkl data/train.bin" in warning
    assert "--track-inputs" in warning
    shown = project.cascade("show", run_id, check=True).stdout
    assert "data/train.bin" in shown and "inputs" in shown

    code, restored, stderr = _restore(project, "v1")
    assert code == 0, stderr
    assert restored["verdict"]["verdict"] == "BITWISE_IDENTICAL", restored["verdict"]["summary"]
    assert restored["plan"]["input_sources"] == {"data/meta.pkl": "checkout", "data/train.bin": "checkout"}
    assert "copied 2 input file(s) from your checkout into the worktree, sha256-verified" in stderr
    worktree = Path(restored["worktree"]["path"])
    assert _sha256(worktree / "data" / "train.bin") == _sha256(data / "train.bin")


@pytest.mark.parametrize("change", ["missing", "changed"])
def test_restore_says_what_input_is_not_here_before_it_starts(nano: Project, change: str) -> None:
    project = nano
    project.record("--tag", "v1", "train_nano.py")
    runs_before = len(project.runs())
    train = project.root / "data" / "train.bin"
    if change == "missing":
        train.unlink()
    else:
        train.write_bytes(train.read_bytes()[::-1])
    result = project.cascade("restore", "v1")  # the plan, as a person reads it, then the refusal
    code, stderr = result.returncode, result.stderr
    assert code == 1, stderr
    said = " ".join(stderr.split())
    plan_line = {"missing": "NOT in your checkout", "changed": "CHANGED in your checkout since the run"}
    assert f"inputs 1 file(s) {plan_line[change]}: data/train.bin" in said  # in the plan, then refused
    assert (
        "inputs 1 file(s) neither git nor DVC tracks, taken from your checkout (sha256-verified): "
        "data/meta.pkl" in said
    )
    assert f"data/train.bin ({change}" in said
    assert "neither git nor DVC tracks" in said and "--track-inputs" in said
    assert "data/meta.pkl (" not in said  # it is here as recorded
    assert len(project.runs()) == runs_before  # nothing was run
    assert not (project.root / ".cascade" / "restore" / "v1").exists()  # nothing was written


def test_track_inputs_keeps_them_in_the_dvc_cache_and_restore_takes_them_from_there(nano: Project) -> None:
    project = nano
    project.cascade("init", check=True)
    project.commit("cascade init")
    result = project.cascade("run", "--track-inputs", "--tag", "v1", "train_nano.py")
    assert result.returncode == 0, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    train = project.root / "data" / "train.bin"
    md5 = hashlib.md5(train.read_bytes()).hexdigest()
    (entry,) = [i for i in record["inputs"] if i["path"] == "data/train.bin"]
    assert entry["md5"] == md5 and entry["sha256"] == _sha256(train)
    assert (project.root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).is_file()
    assert "neither git nor DVC tracks" not in result.stderr  # kept: nothing to warn about
    train.write_bytes(b"the user's data moved on")
    (project.root / "data" / "meta.pkl").unlink()

    code, restored, stderr = _restore(project, "v1")
    assert code == 0, stderr
    assert restored["verdict"]["verdict"] == "BITWISE_IDENTICAL", restored["verdict"]["summary"]
    assert restored["plan"]["input_sources"] == {"data/meta.pkl": "dvc", "data/train.bin": "dvc"}
    worktree = Path(restored["worktree"]["path"])
    assert hashlib.md5((worktree / "data" / "train.bin").read_bytes()).hexdigest() == md5
    # the re-run keeps them as the run did (it warned they came from the checkout only, as loose files)
    assert "neither git nor DVC tracks" not in stderr
    (rerun,) = [r for r in project.runs() if r.data.tags.get("cascade.restored_from")]
    reread = {i["path"]: i.get("md5") for i in project.manifest(rerun.info.run_id)["inputs"]}
    assert reread["data/train.bin"] == md5


def test_a_rerun_that_crashes_is_reported_as_a_crash_not_as_a_trace_setting(
    nano: Project, isolated_env: Path
) -> None:
    project = nano
    project.record("--tag", "v1", "train_nano.py")
    (isolated_env / "crash-now").write_text("")
    code, restored, stderr = _restore(project, "v1")
    assert code == 3, stderr
    summary = restored["verdict"]["summary"]
    assert "trace-interval" not in summary
    assert "the re-run FAILED with exit code 1" in summary
    assert "RuntimeError: boom on purpose" in summary
    assert "last words before the crash" in summary  # its last lines


# -- 14.7: output written during the run into the repository ---------------------------------------


def test_output_written_into_the_repository_is_an_output_and_restore_is_not_refused(
    project: Project,
) -> None:
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\n")  # out/ and run.log not ignored
    project.write("writer.py", WRITER)
    project.commit("a script that writes out/")
    command = [*CASCADE, "run", "--tag", "v{}", "writer.py"]
    for version in ("1", "2"):  # the second run starts with out/ and run.log of the first in the tree
        with open(project.root / "run.log", "w") as log:
            argv = [part.format(version) for part in command]
            subprocess.run(argv, cwd=project.root, stdout=log, stderr=subprocess.STDOUT, check=True,
                           timeout=300)  # fmt: skip
    runs = sorted(project.runs(), key=lambda r: r.info.start_time)
    record = project.manifest(runs[-1].info.run_id)
    untracked = [u["path"] for u in record["git"]["untracked"]]
    assert "run.log" not in untracked and "out/metrics.txt" not in untracked
    outputs = {o["path"]: o for o in record["outputs"]}
    assert set(outputs) == {"run.log", "out/metrics.txt"}
    assert outputs["out/metrics.txt"]["size"] == (project.root / "out" / "metrics.txt").stat().st_size
    assert record["inputs"] == []

    code, restored, stderr = _restore(project, "v2")
    assert code == 0, stderr
    assert "tampered" not in stderr
    assert restored["verdict"]["verdict"] == "BITWISE_IDENTICAL"


def test_an_earlier_run_s_redirected_output_does_not_make_the_next_run_dirty(project: Project) -> None:
    """`cascade run train.py > d.log 2>&1`: cascade's own last lines ("see it: ...") went into d.log
    after the run noted it as its output, so the next run (`> e.log 2>&1`) found it changed since:
    dirty, d.log stored as an untracked file, and "uncommitted changes differ" a cause in verify."""
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\n")  # the logs not ignored
    project.commit("logs not ignored")
    for log_name in ("d.log", "e.log"):
        with open(project.root / log_name, "w") as log:
            subprocess.run([*CASCADE, "run", "train.py"], cwd=project.root, stdout=log,
                           stderr=subprocess.STDOUT, check=True, timeout=300)  # fmt: skip
    assert "see it: cascade show" in (project.root / "d.log").read_text()
    runs = sorted(project.runs(), key=lambda r: r.info.start_time)
    record = project.manifest(runs[-1].info.run_id)
    assert [u["path"] for u in record["git"]["untracked"]] == []
    assert record["git"]["dirty"] is False
    assert "d.log" in [e["path"] for e in record["git"]["earlier_outputs"]]


def test_an_untracked_file_is_stored_as_the_bytes_that_were_hashed(project: Project) -> None:
    project.write("notes/big.txt", "x" * 100_000)
    run_id = project.record("train.py")
    record = project.manifest(run_id)
    (entry,) = [u for u in record["git"]["untracked"] if u["path"] == "notes/big.txt"]
    stored = project.client().download_artifacts(run_id, "cascade/untracked/notes/big.txt",
                                                 str(project.root.parent / "dl"))  # fmt: skip
    assert hashlib.sha256(Path(stored).read_bytes()).hexdigest() == entry["sha256"]
    assert Path(stored).stat().st_size == entry["size"]


def test_diff_against_current_compares_the_inputs_as_they_are_here(nano: Project) -> None:
    """`cascade diff RUN current` listed every input the run read as "removed", present and unchanged."""
    project = nano
    run_id = project.record("train_nano.py")
    data = json.loads(project.cascade("diff", run_id, "current", "--json", check=True).stdout)["data"]
    changed = [c["key"] for s in data["sections"] for c in s["changes"] if c["key"].startswith("data/")]
    assert changed == [], changed
    (project.root / "data" / "train.bin").write_bytes(b"\x01" * 8192)
    (project.root / "data" / "meta.pkl").unlink()
    data = json.loads(project.cascade("diff", run_id, "current", "--json", check=True).stdout)["data"]
    changes = {c["key"]: c for s in data["sections"] for c in s["changes"] if c["key"].startswith("data/")}
    assert set(changes) == {"data/train.bin", "data/meta.pkl"}
    assert changes["data/meta.pkl"]["b"] is None and changes["data/train.bin"]["b"] is not None


OUTSIDE = """
import sys, torch
bias = float(open(sys.argv[1]).read())  # a file outside the repository
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4) + bias
for step in range(3):
    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
"""


def test_a_file_read_outside_the_repository_is_named_not_silently_lost(project: Project,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """A tester's script read /tmp/.../bias.txt: nothing recorded it, no warning, and when it changed
    verify blamed nondeterministic computation ("rerun with --deterministic strict")."""
    outside = tmp_path / "elsewhere" / "bias.txt"
    outside.parent.mkdir()
    outside.write_text("0.5")
    project.write("outside.py", OUTSIDE)
    project.commit("reads a file outside the repository")
    first = project.cascade("run", "outside.py", str(outside), check=True)
    assert f"the script read 1 file(s) outside the repository ({outside})" in " ".join(first.stderr.split())
    a = project.only_run().info.run_id
    assert project.manifest(a)["outcome"]["read_outside"] == {"count": 1, "paths": [str(outside)]}
    outside.write_text("0.9")
    b = project.record("outside.py", str(outside))
    verdict = json.loads(project.cascade("verify", a, b, "--json").stdout)["data"]
    assert verdict["verdict"] == "DIVERGED"
    cause = verdict["likely_causes"][0]
    assert cause["summary"].startswith("the script read files outside the repository") and str(outside) in \
        cause["summary"]  # fmt: skip
    # show and the restore plan name them too (they said nothing of them)
    shown = " ".join(project.cascade("show", a, check=True).stdout.split())
    assert f"read outside 1 file(s) outside the repository, named, not recorded: {outside}" in shown
    planned = project.cascade("restore", a, "--no-run")
    said = " ".join(planned.stderr.split())
    assert f"outside 1 file(s) read outside the repository, not recorded: the re-run reads them as they " \
        f"are here: {outside}" in said, said  # fmt: skip
