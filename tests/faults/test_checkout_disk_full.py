"""`cascade checkout --to DIR` (and restore's placing of files) on a disk that fills up: it said
`OSError: [Errno 28] ... run with -v` with no fix named, and left a partial `.NAME.cascade.tmp` in the
target. Now a clear error that names the file and the fix, exit 1, and nothing half-written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.helpers import small_tmpfs
from tests.plugin import Project

pytestmark = [pytest.mark.slow, pytest.mark.requires_root]

BIG_CHECKPOINT = """\
import torch

model = torch.nn.Linear(512, 512)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    opt.zero_grad(); model(torch.ones(4, 512)).sum().backward(); opt.step()
import os
os.makedirs("checkpoints", exist_ok=True)
torch.save(model.state_dict(), "checkpoints/model.pt")  # ~1 MiB
"""


def test_checkout_onto_a_full_disk_says_so_and_leaves_nothing_half_written(
    project: Project, tmp_path: Path
) -> None:
    project.cascade("init", check=True)
    project.write("big.py", BIG_CHECKPOINT)
    project.commit("a script with a 1 MiB checkpoint")
    project.record("--tag", "v1", "big.py")
    with small_tmpfs(tmp_path / "small", "256k") as target:
        result = project.cascade("checkout", "v1", "--to", str(target))
        assert result.returncode == 1, result.stderr
        said = " ".join(result.stderr.split())
        assert "no space left" in said.lower() and "model.pt" in said and "free space" in said, said
        assert "run with -v" not in said and "Traceback" not in said
        assert [p.name for p in target.rglob("*") if p.is_file()] == []
        assert os.statvfs(target).f_bavail > 0  # the partial copy's blocks are freed
