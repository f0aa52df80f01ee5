"""The Docker suite's fixtures: a real engine, the local base image, an offline wheelhouse, a project.

No image registry is reachable here: the base image is a Debian root made by scripts/docker_base.sh
(debootstrap + `docker import`, cached by tag), and torch comes from the CPU wheel on disk through
the wheelhouse option (`pip download`, cached under test-artifacts/). The suite is marked
requires_docker: it skips, saying why, only when no engine answers at all (`make test` starts one as
root: scripts/services.sh).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.plugin import SCRIPTS, Project, git

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "cascade-test/python:3.11-bookworm"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "numpy", "xxhash")}


@pytest.fixture(scope="session")
def docker_client() -> Any:
    import docker  # the suite is marked requires_docker: an engine answered the probe

    return docker.from_env(timeout=300)


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """The local Debian + Python 3.11 base (built once, cached by tag)."""
    built = subprocess.run(["bash", str(REPO / "scripts" / "docker_base.sh"), BASE_IMAGE],
                           capture_output=True, text=True)  # fmt: skip
    assert built.returncode == 0, f"cannot build the base image:\n{built.stdout}\n{built.stderr}"
    return BASE_IMAGE


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """torch (the CPU wheel on disk), numpy and xxhash at this environment's versions, with their deps."""
    versions = _versions()
    where = REPO / "test-artifacts" / "wheelhouse"
    where.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version.partition('+')[0]}" for name, version in versions.items()]
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(where), *pins],
                         capture_output=True, text=True)  # fmt: skip
    assert got.returncode == 0, f"pip download {pins} failed:\n{got.stderr[-2000:]}"
    return where


def write_docker_project(root: Path, base: str, wheelhouse: Path, extra: str = "") -> Project:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    project = Project(root)
    project.write("train.py", (SCRIPTS / "train.py").read_text())
    project.write("hyperparameters.yaml", "seed: 3\nsteps: 12\noptimizer:\n  lr: 0.1\n  momentum: 0.9\n"
                                          "model:\n  hidden: 16\n")  # fmt: skip
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\n")
    versions = _versions()
    project.write(
        "requirements.lock", f"torch=={versions['torch'].partition('+')[0]}\nnumpy=={versions['numpy']}\n"
    )
    project.write(
        "cascade.yaml",
        f"docker:\n  base_image: {base}\n  wheelhouse: {wheelhouse}\n  offline: true\n"
        f"  ca_bundle: {CA_BUNDLE}\n{extra}",
    )
    project.commit("initial")
    return project


@pytest.fixture
def docker_project(tmp_path: Path, base_image: str, wheelhouse: Path) -> Project:
    """A committed repo whose image installs torch and numpy offline from the wheelhouse."""
    return write_docker_project(tmp_path / "proj", base_image, wheelhouse)


@pytest.fixture(scope="session", autouse=True)
def remove_test_images() -> Iterator[None]:
    """The suite's project images go when it ends (the base image stays: it is the cache)."""
    yield
    try:
        import docker

        client = docker.from_env()
        for image in client.images.list(name="cascade/proj"):
            client.images.remove(image.id, force=True)
    except Exception:
        pass
