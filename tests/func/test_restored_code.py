"""A restore's re-run imports the project's own modules from the restored code, where an editable
install (`pip install -e .`, real, in a venv of the test's own) or an absolute PYTHONPATH would
find them in the checkout at today's commit (child/restored_code.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "mylib"
version = "0.1"
"""

TRAIN = """import torch
import mylib
from mylib import losses

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(10):
    opt.zero_grad()
    loss = losses.mse(model(x) * mylib.SCALE * mylib.generated.FACTOR, y)
    loss.backward()
    opt.step()
print("mylib from", mylib.__file__)
"""


def _library(project: Project, package: str) -> None:
    """mylib, whose SCALE the training uses, with a submodule and a module git ignores (generated
    in place: the restored code does not have it)."""
    project.write(f"{package}/__init__.py", "from mylib import generated\nSCALE = 1.0\n")
    project.write(f"{package}/losses.py", "def mse(a, b):\n    return ((a - b) ** 2).mean()\n")
    project.write(f"{package}/generated.py", "FACTOR = 0.5\n")
    project.write(".gitignore", (project.root / ".gitignore").read_text() + f"{package}/generated.py\n")


def _venv_with_editable_install(project: Project, tmp_path: Path) -> Path:
    """A venv that sees this suite's packages (torch, cascade) and has the project installed in
    editable mode, offline (this suite's setuptools builds it)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    ours = sysconfig.get_paths()["purelib"]
    (site / "_suite.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                    str(project.root)], check=True, capture_output=True)  # fmt: skip
    return python


def _cascade(project: Project, python: Path | str, *args: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run([str(python), "-m", "cascade_repro.cli", *args], cwd=project.root, text=True,
                          capture_output=True, timeout=300, env={**os.environ, **(env or {})})  # fmt: skip


def _record_then_move_on(project: Project, python: Path | str, env: dict[str, str] | None = None,
                         target: tuple[str, ...] = ()) -> None:  # fmt: skip
    """v1 with SCALE 1.0, then the library changes in a new commit (and the ignored file stays)."""
    run = _cascade(project, python, "run", "--tag", "v1", *(target or _script(project)), env=env)
    assert run.returncode == 0, run.stderr
    init = next(project.root.glob("**/mylib/__init__.py"))
    init.write_text(init.read_text().replace("1.0", "3.0"))
    project.commit("library: another scale")


def _script(project: Project) -> list[str]:
    return ["scripts/train.py"] if (project.root / "scripts").exists() else ["train.py"]


def _restored(project: Project, python: Path | str,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:  # fmt: skip
    result = _cascade(project, python, "restore", "v1", "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["data"], result.stderr


@pytest.mark.parametrize("layout", ["src", "flat"])
def test_an_editable_install_of_the_project_restores_the_recorded_library_code(
    project: Project, tmp_path: Path, layout: str
) -> None:
    """src layout: setuptools' editable install is a .pth naming src/; flat layout with the script in
    a subdirectory: setuptools' own meta-path finder maps mylib to the checkout."""
    if layout == "src":
        project.write("pyproject.toml", PYPROJECT + '[tool.setuptools.packages.find]\nwhere = ["src"]\n')
        _library(project, "src/mylib")
        project.write("train.py", TRAIN)
    else:
        project.write("pyproject.toml", PYPROJECT + '[tool.setuptools]\npackages = ["mylib"]\n')
        _library(project, "mylib")
        project.write("scripts/train.py", TRAIN)
    project.commit("mylib")
    python = _venv_with_editable_install(project, tmp_path)
    _record_then_move_on(project, python)

    data, stderr = _restored(project, python)

    # before: the re-run trained with the checkout's SCALE 3.0 and DIVERGED at step 0 on the loss
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    moved = "src/mylib" if layout == "src" else "mylib"
    assert f"imports mylib from the restored code ({moved})" in stderr
    worktree = Path(data["plan"]["workdir"])
    assert f"mylib from {worktree / moved / '__init__.py'}" in stderr


def test_a_module_of_an_editable_install_run_by_name_restores_the_recorded_code(
    project: Project, tmp_path: Path
) -> None:
    """`cascade run -m mylib.train`, src layout: the module is found through the editable install's
    .pth in the checkout, recorded as src/mylib/train.py, and re-run by its name from the worktree."""
    project.write("pyproject.toml", PYPROJECT + '[tool.setuptools.packages.find]\nwhere = ["src"]\n')
    _library(project, "src/mylib")
    project.write("src/mylib/train.py", TRAIN)
    project.commit("mylib")
    python = _venv_with_editable_install(project, tmp_path)
    _record_then_move_on(project, python, target=("-m", "mylib.train"))
    (run_id,) = [r.info.run_id for r in project.runs()]
    assert project.manifest(run_id)["command"]["script"] == "src/mylib/train.py"

    data, stderr = _restored(project, python)

    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    worktree = Path(data["plan"]["workdir"])
    assert f"mylib from {worktree / 'src' / 'mylib' / '__init__.py'}" in stderr


def test_an_absolute_pythonpath_into_the_checkout_restores_the_recorded_code(project: Project) -> None:
    project.write("pyproject.toml", PYPROJECT)
    _library(project, "src/mylib")
    project.write("train.py", TRAIN)
    project.commit("mylib")
    ours = os.environ.get("PYTHONPATH")  # (where the suite's cascade may come from)
    env = {"PYTHONPATH": os.pathsep.join([str(project.root / "src"), *([ours] if ours else [])])}
    _record_then_move_on(project, sys.executable, env)

    data, stderr = _restored(project, sys.executable, env)

    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    assert "imports mylib from the restored code (src/mylib)" in stderr


def test_the_pythonpath_a_run_had_is_recorded_and_a_restore_without_it_names_it(
    project: Project, tmp_path: Path
) -> None:
    """Packages on PYTHONPATH outside the environment (`pip install --target DIR`): the record did not
    hold PYTHONPATH, so a restore from a shell without it failed on an import the plan never named."""
    packages = tmp_path / "packages"
    (packages / "extra").mkdir(parents=True)
    (packages / "extra" / "__init__.py").write_text("SCALE = 2.0\n")
    project.write("train.py", TRAIN.replace("import mylib\nfrom mylib import losses\n", "import extra\n")
                  .replace("losses.mse(model(x) * mylib.SCALE * mylib.generated.FACTOR, y)",
                           "((model(x) * extra.SCALE - y) ** 2).mean()")
                  .replace('print("mylib from", mylib.__file__)', ""))  # fmt: skip
    project.commit("extra")
    ours = os.environ.get("PYTHONPATH")
    with_packages = os.pathsep.join([str(packages), *([ours] if ours else [])])
    run_id = project.record("--tag", "v1", "train.py", env={"PYTHONPATH": with_packages})
    assert project.manifest(run_id)["environment"]["PYTHONPATH"] == with_packages

    without = project.cascade("restore", "v1", env={"PYTHONPATH": ours or ""})

    assert "No module named 'extra'" in without.stderr  # (the re-run cannot import it)
    assert "not set from the record: PYTHONPATH" in without.stdout + without.stderr
    again = project.cascade("restore", "v1", env={"PYTHONPATH": with_packages})
    assert again.returncode == 0 and "BITWISE_IDENTICAL" in again.stdout, again.stderr


def test_dataloader_workers_spawned_in_a_restore_import_the_restored_code(project: Project) -> None:
    """Spawned processes get the parent's sys.path, not its finders: they unpickled the dataset from
    the checkout's library (the batches differed at step 0)."""
    project.write("src/mylib/__init__.py", """import torch
SCALE = 1.0


class Data(torch.utils.data.Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i] * SCALE, self.y[i]
""")
    project.write("train.py", """import torch
import mylib

if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(mylib.Data(), batch_size=16, num_workers=2,
                                         multiprocessing_context="spawn")
    for x, y in loader:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
""")
    project.commit("mylib")
    ours = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": os.pathsep.join([str(project.root / "src"), *([ours] if ours else [])])}
    _record_then_move_on(project, sys.executable, env)

    data, _ = _restored(project, sys.executable, env)

    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    assert data["verdict"]["steps"]["compared"] == 4
