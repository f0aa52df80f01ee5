"""Inputs a run read and then lost sight of: a resume checkpoint it read and then saved over (nanoGPT's
`--init_from=resume`, Lightning's `fit(ckpt_path="last")`), files it read and then deleted or renamed
away (HF's checkpoint rotation), weights read through safetensors (Rust opens the file), and a file
outside the repository the run wrote itself before reading it back (its output, not an outside input).

Each is checked on what the record holds: the input's sha256 is that of the bytes the script read, and
a restore gives the re-run exactly those.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _input(path: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"path": path, "size": len(data), "sha256": _sha256(data), **extra}


def _dvc(project: Project) -> Project:
    project.cascade("init", check=True)
    project.commit("cascade init")
    return project


# -- 1: a resume checkpoint read and then saved over ------------------------------------------------

RESUME = """\
import os, sys, torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if sys.argv[1:] == ["resume"]:  # nanoGPT's --init_from=resume: the same path it saves to later
    ckpt = torch.load(os.path.join("out", "ckpt.pt"))
    model.load_state_dict(ckpt["model"])
    start = ckpt["iter"]
x = torch.ones(8, 4)
for it in range(start, start + 3):
    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
os.makedirs("out", exist_ok=True)
torch.save({"model": model.state_dict(), "iter": it + 1}, os.path.join("out", "ckpt.pt"))
print("iter", it + 1, "weight", model.weight.sum().item())
"""


def test_a_resume_checkpoint_saved_over_is_an_input_as_read_and_restore_gives_it_back(
    project: Project,
) -> None:
    project.write("resume.py", RESUME)
    project.commit("a script that resumes from its own checkpoint")
    project = _dvc(project)
    project.record("--tag", "r1", "resume.py")
    as_read = (project.root / "out" / "ckpt.pt").read_bytes()
    run_id = project.record("--tag", "r2", "resume.py", "resume")
    record = project.manifest(run_id)
    assert record["inputs"] == [
        _input("out/ckpt.pt", as_read, rewritten=True, md5=hashlib.md5(as_read).hexdigest())
    ]
    assert "out/ckpt.pt" in [o["path"] for o in record["outputs"]] or \
        "out/ckpt.pt" in [c["path"] for c in record["checkpoints"]]  # fmt: skip

    restored = project.cascade("restore", "r2", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["plan"]["input_sources"] == {"out/ckpt.pt": "dvc"}
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]


def test_a_restore_killed_after_its_rerun_saved_over_the_resume_checkpoint_restores_again(
    project: Project,
) -> None:
    """Left from the last stop: a restore of a run that resumed from its own checkpoint, killed
    after its re-run had saved over the checkpoint placed for it, left the worktree unusable: the
    next restore refused it ("already has out/ckpt.pt with other bytes than the run's"). The placed
    input the cut re-run wrote over is now moved aside, like the files it added, and placed again."""
    import signal
    import subprocess
    import time

    from tests.faults.helpers import process_gone
    from tests.plugin import CASCADE

    flag = project.root.parent / "hold-after-save"  # (there for the killed restore's re-run only)
    holds = f"""if os.path.exists({str(flag)!r}):
    open("out/hold", "w").write(str(os.getpid()))
    import time; time.sleep(120)
"""
    project.write("resume.py", RESUME + holds)
    project.commit("a script that resumes from its own checkpoint")
    project = _dvc(project)
    project.record("--tag", "r1", "resume.py")
    project.record("--tag", "r2", "resume.py", "resume")

    flag.write_text("")
    said_first = project.root.parent / "first-restore.err"
    with said_first.open("w") as stderr:
        first = subprocess.Popen([*CASCADE, "restore", "r2"], cwd=project.root, text=True,
                                 stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
    held = project.root / ".cascade" / "restore" / "r2" / "out" / "hold"
    deadline = time.monotonic() + 120
    while not (held.exists() and held.read_text()):
        assert first.poll() is None and time.monotonic() < deadline, \
            f"the restore's re-run never held:\n{said_first.read_text()}"  # fmt: skip
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)  # (after the re-run saved over out/ckpt.pt)
    first.wait(timeout=30)
    assert process_gone(int(held.read_text()), 30), "the re-run outlived its restore"
    flag.unlink()

    restored = project.cascade("restore", "r2", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]
    said = " ".join(restored.stderr.split())
    assert "its last restore was killed during its re-run; moved the 2 file(s) added since" in said, said


def test_a_resume_checkpoint_larger_than_a_kept_copy_is_still_given_back(project: Project) -> None:
    """A real nanoGPT ckpt.pt is larger than the 64 MiB the child copies of a file read then rewritten:
    its bytes as read were hashed but not kept, so restore refused it. Saved over, the file is only
    unlinked: a second name keeps it whatever its size, and it goes into the DVC cache by hardlink."""
    project.write("resume.py", RESUME.replace('{"model": model.state_dict(), "iter": it + 1}',
                                              '{"model": model.state_dict(), "iter": it + 1, '
                                              '"pad": torch.zeros(17 << 20)}'))  # fmt: skip
    project.commit("a script that resumes from its own 68 MiB checkpoint")
    project = _dvc(project)
    project.record("--tag", "r1", "resume.py")
    as_read = (project.root / "out" / "ckpt.pt").read_bytes()
    assert len(as_read) > 64 << 20
    run_id = project.record("--tag", "r2", "resume.py", "resume")
    (item,) = project.manifest(run_id)["inputs"]
    assert item == _input("out/ckpt.pt", as_read, rewritten=True, md5=hashlib.md5(as_read).hexdigest())
    restored = project.cascade("restore", "r2", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["plan"]["input_sources"] == {"out/ckpt.pt": "dvc"}
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]


LIGHTNING_RESUME = """\
import sys, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
from lightning.pytorch.callbacks import ModelCheckpoint

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

L.seed_everything(3)
x = torch.randn(16, 4)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
ck = ModelCheckpoint(dirpath="out/ck", save_last=True)
t = L.Trainer(max_epochs=int(sys.argv[1]), logger=False, callbacks=[ck], enable_progress_bar=False,
              enable_model_summary=False)
t.fit(M(), data, ckpt_path="last" if sys.argv[2:] == ["resume"] else None)
"""


def test_lightning_fit_from_last_records_last_ckpt_as_read(project: Project) -> None:
    pytest.importorskip("lightning", reason="lightning is a test extra (pip install -e '.[dev]')")
    project.write("lit.py", LIGHTNING_RESUME)
    project.commit("a Lightning script that resumes from last.ckpt")
    project.record("lit.py", "1")
    as_read = (project.root / "out" / "ck" / "last.ckpt").read_bytes()
    record = project.manifest(project.record("lit.py", "2", "resume"))
    assert _input("out/ck/last.ckpt", as_read, rewritten=True) in record["inputs"]
    assert (project.root / "out" / "ck" / "last.ckpt").read_bytes() != as_read  # saved over


# -- 2: files read and then deleted or renamed away -------------------------------------------------

REMOVES = """\
import os, shutil

state = open("out/state.pt", "rb").read()
note = open("out/note.txt").read()
shard = open("out/checkpoint-12/optimizer.pt", "rb").read()  # HF's rotation removes the directory
old = open("out/old.txt").read()
cfg = open("out/cfg.txt").read()
os.remove("out/state.pt")
os.unlink("out/note.txt")
shutil.rmtree("out/checkpoint-12")
os.rename("out/old.txt", "out/new.txt")
with open("out/cfg.tmp", "w") as f:  # an atomic update: write beside, then replace what it read
    f.write(cfg + " and more")
os.replace("out/cfg.tmp", "out/cfg.txt")
print(len(state), note, len(shard), old)
"""

READ_BEFORE = {
    "out/state.pt": b"\x00weights" * 50,
    "out/note.txt": b"hello",
    "out/checkpoint-12/optimizer.pt": b"moments" * 30,
    "out/old.txt": b"renamed away",
    "out/cfg.txt": b"lr=0.1",
}


def _removes(project: Project) -> Project:
    project.write("removes.py", REMOVES)
    project.commit("a script that reads files and then removes them")
    for rel, data in READ_BEFORE.items():
        project.write(rel, data)
    return project


def test_files_read_then_removed_are_inputs_as_read_and_restore_places_them(project: Project) -> None:
    project = _dvc(_removes(project))
    run_id = project.record("--tag", "rm1", "removes.py")
    record = project.manifest(run_id)
    kept = [_input(p, b, rewritten=True, md5=hashlib.md5(b).hexdigest()) for p, b in READ_BEFORE.items()]
    assert record["inputs"] == sorted(kept, key=lambda i: i["path"])
    assert not (project.root / "out" / "state.pt").exists()
    assert {"out/new.txt", "out/cfg.txt"} <= {o["path"] for o in record["outputs"]}

    restored = project.cascade("restore", "rm1", "--no-run", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["plan"]["input_sources"] == dict.fromkeys(sorted(READ_BEFORE), "dvc")
    tree = Path(data["worktree"]["path"])
    for rel, content in READ_BEFORE.items():
        assert (tree / rel).read_bytes() == content, rel


def test_files_read_then_removed_without_dvc_are_recorded_and_named(project: Project) -> None:
    project = _removes(project)
    result = project.cascade("run", "removes.py")
    assert result.returncode == 0, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    assert sorted(i["path"] for i in record["inputs"]) == sorted(READ_BEFORE)
    assert all(i["rewritten"] and i["sha256"] == _sha256(READ_BEFORE[i["path"]]) for i in record["inputs"])
    said = " ".join(result.stderr.split())
    assert "read 5 file(s) and then rewrote or removed them" in said and "out/state.pt" in said


# -- 3: weights read through safetensors ------------------------------------------------------------

SAFETENSORS_READS = """\
from safetensors import safe_open
from safetensors.torch import load_file

weights = load_file("weights/a.safetensors")
with safe_open("weights/b.safetensors", framework="pt") as f:
    b = {k: f.get_tensor(k) for k in f.keys()}
print(sorted(weights), sorted(b))
"""


def test_weights_read_through_safetensors_are_inputs(project: Project) -> None:
    import torch
    from safetensors.torch import save_file

    project.write(".gitignore", (project.root / ".gitignore").read_text() + "weights/\n")
    project.write("st.py", SAFETENSORS_READS)
    project.commit("a script that loads safetensors")
    (project.root / "weights").mkdir()
    save_file({"w": torch.arange(6.0)}, str(project.root / "weights" / "a.safetensors"))
    save_file({"v": torch.ones(3)}, str(project.root / "weights" / "b.safetensors"))
    record = project.manifest(project.record("st.py"))
    assert record["inputs"] == [
        _input(f"weights/{name}.safetensors", (project.root / "weights" / f"{name}.safetensors").read_bytes())
        for name in ("a", "b")
    ]


FROM_PRETRAINED = """\
from transformers import GPT2LMHeadModel

model = GPT2LMHeadModel.from_pretrained("pretrained")
print(sum(p.numel() for p in model.parameters()))
"""


def test_hf_from_pretrained_records_the_safetensors_weights(project: Project) -> None:
    transformers = pytest.importorskip("transformers")
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "pretrained/\n")
    project.write("ft.py", FROM_PRETRAINED)
    project.commit("a script that loads a local pretrained model")
    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(project.root / "pretrained")
    weights = (project.root / "pretrained" / "model.safetensors").read_bytes()
    record = project.manifest(project.record("ft.py"))
    assert _input("pretrained/model.safetensors", weights) in record["inputs"]


# -- 12: the run's own file outside the repository, read back -----------------------------------------

OWN_OUTSIDE = """\
import sys, torch

model = torch.nn.Linear(4, 1)
torch.save(model.state_dict(), sys.argv[1])  # --save /tmp/x/model.pt
with open(sys.argv[2], "w") as f:
    f.write("written by this run")
print(open(sys.argv[2]).read())
model.load_state_dict(torch.load(sys.argv[1]))  # read back at the end: its own output
"""


def test_a_file_the_run_wrote_outside_and_read_back_is_its_own(project: Project, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    project.write("own.py", OWN_OUTSIDE)
    project.commit("saves outside the repository and reads it back")
    result = project.cascade("run", "own.py", str(elsewhere / "model.pt"), str(elsewhere / "log.txt"))
    assert result.returncode == 0, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    assert "read_outside" not in record["outcome"], record["outcome"]
    said = " ".join(result.stderr.split())
    assert "file(s) outside the repository" not in said  # (not "the script read 1 file(s) outside ...")
    assert "model.pt (outside the repository: save checkpoints inside it)" in said  # its checkpoint, said


def test_a_dataset_linked_into_the_repository_from_outside_is_named_as_read_outside(project: Project) -> None:
    """Left from the last stop: a dataset directory linked into the repository from elsewhere (shared
    storage, a sibling directory) was read and then recorded nowhere and said nowhere: `check` called
    the run reproducible, and a restore's re-run failed inside the script."""
    outside = project.root.parent / "datasets"
    outside.mkdir()
    (outside / "train.bin").write_bytes(b"tokens " * 100)
    (project.root / "data").symlink_to("../datasets")
    project.write("reads.py", "print(len(open('data/train.bin', 'rb').read()))\n")
    project.commit("reads a linked dataset")
    result = project.cascade("run", "reads.py", check=True)
    real = str((outside / "train.bin").resolve())
    said = " ".join(result.stderr.split())
    assert f"read 1 file(s) outside the repository ({real})" in said, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    assert record["outcome"]["read_outside"] == {"count": 1, "paths": [real]}
    assert record["inputs"] == []


TRAINS_ON_LINKED = """\
import torch

data = torch.frombuffer(bytearray(open("data/train.bin", "rb").read()), dtype=torch.uint8).float()
weight = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([weight], lr=0.1)
for _ in range(3):
    loss = ((weight - data.mean()) ** 2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_restore_follows_a_committed_link_to_a_dataset_outside_as_the_run_did(project: Project) -> None:
    """Left from the last stop: a committed relative link `data -> ../datasets` dangled in the
    restore's worktree (`.cascade/restore/ID/`, two levels deeper), and the re-run failed inside the
    script. The restore now reaches what the link reached from the checkout, and says that those
    files are not recorded."""
    outside = project.root.parent / "datasets"
    outside.mkdir()
    (outside / "train.bin").write_bytes(b"tokens " * 100)
    (project.root / "data").symlink_to("../datasets")
    project.write("reads.py", TRAINS_ON_LINKED)
    project.commit("trains on a linked dataset")
    project.record("--tag", "linked", "reads.py")

    restored = project.cascade("restore", "linked", "--json")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]
    said = " ".join(restored.stderr.split())
    assert f"data -> ../datasets reaches {outside.resolve()}, outside the repository: not recorded" in said
    # the committed link itself is as the commit has it
    workdir = Path(data["plan"]["workdir"])
    assert os.readlink(workdir / "data") == "../datasets"
    assert project.cascade("restore", "linked", "--json").returncode == 0  # its worktree reused
    assert os.readlink(workdir.parent / "datasets") == str(outside)  # cascade's own link, beside it

    # a worktree of the user's choosing elsewhere gets no link beside it: said, with the way out
    elsewhere = project.root.parent / "elsewhere" / "restored"
    no_run = project.cascade("restore", "linked", "--no-run", "--workdir", str(elsewhere))
    assert no_run.returncode == 0, no_run.stderr
    assert (
        "the committed link data -> ../datasets reaches " f"{outside.resolve()}, outside the repository; the "
        "re-run cannot reach it from the restore's worktree (make the link absolute, or restore with "
        "--workdir beside the checkout)"
    ) in " ".join(no_run.stderr.split())
    assert not os.path.lexists(elsewhere.parent / "datasets")

