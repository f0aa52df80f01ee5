"""Checkpoints written with safetensors, which `torch.save` never sees: Accelerate's `save_state`
directory is one checkpoint (model.safetensors included) at the step it was saved, as the HF
Trainer's `checkpoint-N/` is; a plain `safetensors.torch.save_file` / `save_model` is one file,
as a `torch.save` is. Real Accelerate and safetensors, a tiny model on CPU, a real DVC cache."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.plugin import SCRIPTS, Project

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate", reason="accelerate is a test extra (pip install -e '.[dev]')")
pytest.importorskip("safetensors", reason="safetensors comes with accelerate and transformers")

FRAMEWORKS = SCRIPTS / "frameworks"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _cache_object(project: Project, md5: str) -> Path:
    return project.root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def _checkpoints(project: Project, run_id: str) -> dict[str, dict[str, Any]]:
    shown = json.loads(project.cascade("show", run_id, "--json", check=True).stdout)["data"]
    return {c["path"]: c for c in shown["manifest"]["checkpoints"]}


@pytest.fixture
def accelerate_project(project: Project) -> Project:
    project.write("train_accelerate.py", (FRAMEWORKS / "train_accelerate.py").read_text())
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\nckpt/\nacc/\nmarkers/\n")
    project.cascade("init", check=True)  # a DVC cache for the checkpoints
    project.commit("an Accelerate script, cascade init")
    return project


def test_accelerate_save_state_is_one_directory_checkpoint_at_its_step(accelerate_project: Project,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    project = accelerate_project
    run_id = project.record("--tag", "v1.0", "train_accelerate.py")
    checkpoints = _checkpoints(project, run_id)
    saved = [f"ckpt/step_{n}" for n in (20, 40, 60)]
    markers = [f"markers/step_{n}.pt" for n in (20, 40, 60)]
    # the directory, not optimizer.bin, scheduler.bin, random_states_0.pkl one by one
    assert sorted(checkpoints) == sorted(saved + markers)
    for directory, marker in zip(saved, markers, strict=True):
        entry, beside = checkpoints[directory], checkpoints[marker]
        assert entry["status"] == "kept" and entry["source"] == "accelerate"
        assert entry["step"] == beside["step"] is not None  # the step a torch.save there is recorded at
        assert entry["md5"].endswith(".dir") and entry["files"] == 4
        listing = json.loads(_cache_object(project, entry["md5"]).read_text())
        written = project.root / directory
        assert {m["relpath"]: m["md5"] for m in listing} == {
            name: _md5(written / name)
            for name in ("model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl")
        }
    assert [checkpoints[d]["step"] for d in saved] == [19, 39, 59]  # 0-based, as for torch.save
    listed = project.cascade("show", run_id, "--checkpoints", check=True).stdout
    assert "ckpt/step_20" in listed and "optimizer.bin" not in listed and "random_states" not in listed
    out = tmp_path / "restored"
    taken = project.cascade("checkout", "v1.0", "--to", str(out))  # the last one: the whole directory
    assert taken.returncode == 0 and "ckpt/step_60" in taken.stderr, taken.stderr
    written = project.root / "ckpt" / "step_60"
    assert sorted(p.name for p in (out / "step_60").iterdir()) == sorted(p.name for p in written.iterdir())
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        assert (out / "step_60" / name).read_bytes() == (written / name).read_bytes()


def test_accelerate_automatic_naming_keeps_what_total_limit_keeps(accelerate_project: Project) -> None:
    project = accelerate_project
    run_id = project.record("train_accelerate.py", "--auto")
    checkpoints = {p: c for p, c in _checkpoints(project, run_id).items() if p.startswith("acc/")}
    names = [f"acc/checkpoints/checkpoint_{i}" for i in range(3)]
    assert sorted(checkpoints) == names
    assert [checkpoints[n]["status"] for n in names] == ["pruned", "kept", "kept"]  # total_limit=2
    assert [checkpoints[n]["step"] for n in names] == [19, 39, 59]
    assert all(checkpoints[n]["files"] == 4 for n in names[1:])


SAFETENSORS = """
import os, torch
from safetensors.torch import save_file, save_model
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
os.makedirs("ckpt", exist_ok=True)
for it in range(6):
    opt.zero_grad(); model(torch.randn(8, 64)).pow(2).mean().backward(); opt.step()
    if it % 2 == 1:  # the same file every eval: each version must stay intact in the DVC cache
        save_file({**model.state_dict(), "iter": torch.tensor(it)}, "ckpt/model.safetensors")
save_model(model, os.path.join("ckpt", "final.safetensors"))
"""


def test_a_safetensors_save_is_a_checkpoint_like_torch_save(project: Project, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    project.write("save_safetensors.py", SAFETENSORS)
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\nckpt/\n")
    project.cascade("init", check=True)
    project.commit("a script saving safetensors")
    run_id = project.record("--tag", "v-st", "save_safetensors.py")
    entries = project.manifest(run_id)["checkpoints"]
    assert [(c["path"], c["step"], c["status"], c["source"]) for c in entries] == [
        *[("ckpt/model.safetensors", step, "kept", "safetensors") for step in (1, 3, 5)],
        ("ckpt/final.safetensors", 5, "kept", "safetensors"),
    ]
    versions = [load_file(_cache_object(project, c["md5"])) for c in entries[:3]]
    assert [int(v["iter"]) for v in versions] == [1, 3, 5]  # each cache object is the version of its step
    final = project.root / "ckpt" / "final.safetensors"
    assert entries[3]["md5"] == _md5(final) and entries[3]["size"] == final.stat().st_size
    out = tmp_path / "restored"
    taken = project.cascade("checkout", "v-st", "--checkpoint", "ckpt/final.safetensors", "--to", str(out))
    assert taken.returncode == 0, taken.stderr
    assert (out / "final.safetensors").read_bytes() == final.read_bytes()
