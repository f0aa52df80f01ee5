"""Pure parts of the Docker support: settings, requirements, the rendered Dockerfile, GPUs, mounts, env."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro.errors import ConfigError, DockerError, UsageError
from cascade_repro.images import context
from cascade_repro.images.container import container_environment, mount_points
from cascade_repro.images.prepare import choose_gpus, package_drift
from cascade_repro.project import template_path


def test_settings_are_validated_with_the_fix_named(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    settings = context.docker_settings({"wheelhouse": "wheels", "offline": True, "gpus": "2"}, tmp_path)
    assert settings.wheelhouse == tmp_path / "wheels" and settings.offline and settings.gpus == "2"
    with pytest.raises(ConfigError, match="unknown docker setting.*basse_image"):
        context.docker_settings({"basse_image": "x"}, tmp_path)
    with pytest.raises(ConfigError, match="docker.offline needs docker.wheelhouse"):
        context.docker_settings({"offline": True}, tmp_path)
    with pytest.raises(ConfigError, match="docker.ca_bundle missing.pem does not exist"):
        context.docker_settings({"ca_bundle": "missing.pem"}, tmp_path)
    with pytest.raises(ConfigError, match="docker.gpus must be"):
        context.docker_settings({"gpus": "some"}, tmp_path)


def test_captured_packages_become_pins_without_what_no_index_has() -> None:
    packages = {
        "numpy": {"version": "2.1.0"},
        "mylib": {"version": "0.1", "origin": "editable", "url": "file:///src/mylib"},
        "cascade-repro": {"version": "0.1.0", "origin": "editable"},
        "pip": {"version": "24.0"},
        "torch": {"version": "2.13.0+cpu"},
    }
    reqs = context.requirements_from_packages(packages)
    assert [line for line in reqs.text.splitlines() if not line.startswith("#")] == [
        "--extra-index-url https://download.pytorch.org/whl/cpu", "numpy==2.1.0", "torch==2.13.0+cpu",
    ]  # fmt: skip
    assert reqs.left_out == ("mylib (editable)",) and reqs.source == "captured packages"


def test_lock_file_wins_over_captured_packages(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    assert (
        context.project_requirements(tmp_path, None, {"numpy": {"version": "1"}}).source == "requirements.txt"
    )
    (tmp_path / "requirements.lock").write_text("torch==2.13.0\nnumpy==2.1.0\n")
    assert context.project_requirements(tmp_path, None, {}).source == "requirements.lock"
    with pytest.raises(ConfigError, match="docker.requirements reqs/prod.txt does not exist"):
        context.project_requirements(tmp_path, "reqs/prod.txt", {})


def test_wheelhouse_and_ca_bundle_stay_in_the_build_stage(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "ca.crt").write_text("cert")
    settings = context.docker_settings(
        {"wheelhouse": "wheels", "ca_bundle": "ca.crt", "offline": True}, tmp_path
    )
    text = context.render_dockerfile(template_path("Dockerfile.j2").read_text(), settings, "base:1")
    deps, final = text.split("\nFROM base:1\n")
    assert deps.startswith("# ") and "FROM base:1 AS deps" in deps
    assert "COPY wheelhouse" in deps and "COPY ca.pem" in deps and "PIP_NO_INDEX=1" in deps
    assert "wheelhouse" not in final and "ca.pem" not in final and "PIP_CERT" not in final
    assert "COPY --from=deps /opt/venv /opt/venv" in final and "COPY project /workspace" in final
    plain = context.render_dockerfile(
        template_path("Dockerfile.j2").read_text(), context.DockerSettings(), "b:2"
    )
    assert (
        "wheelhouse" not in plain.split("FROM b:2 AS deps")[1] and "ca.pem" not in plain.split("AS deps")[1]
    )


def test_default_base_image_follows_this_python_and_torch_build() -> None:
    import sys

    assert (
        context.default_base_image("2.13.0+cpu")
        == f"python:{sys.version_info.major}.{sys.version_info.minor}-slim"
    )
    assert context.default_base_image("2.5.1+cu124") == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert context.image_repository("My Project!") == "cascade/my-project"
    assert context.image_repository("a..b-.c") == "cascade/a-b-c"


def test_gpus_are_requested_only_where_there_are_some() -> None:
    assert choose_gpus("auto", 0) is None and choose_gpus("auto", 2) == "all"
    assert choose_gpus("none", 8) is None and choose_gpus("1", 2) == 1 and choose_gpus("all", 1) == "all"
    assert choose_gpus("0", 2) is None
    with pytest.raises(UsageError, match="--gpus takes all, none, auto or a number"):
        choose_gpus("0,1", 2)
    with pytest.raises(DockerError, match=r"--gpus all\) but this machine has none"):
        choose_gpus("all", 0)
    with pytest.raises(DockerError, match="more GPUs than this machine has"):
        choose_gpus("4", 2)


def test_mounts_and_environment_of_the_container(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    assert mount_points([root, root / ".cascade" / "runs" / "x", tmp_path / "store"]) == [
        str(root), str(tmp_path / "store"),
    ]  # fmt: skip
    host = {"PATH": "/host/bin", "VIRTUAL_ENV": "/host/.venv", "SSH_AUTH_SOCK": "s"}
    env = container_environment({**host, "OMP_NUM_THREADS": "2", "MY_SETTING": "x", "CASCADE_RUN_DIR": "/r"})
    assert env == {"OMP_NUM_THREADS": "2", "MY_SETTING": "x", "CASCADE_RUN_DIR": "/r", "HOME": "/tmp"}


def test_package_drift_names_each_changed_version() -> None:
    recorded = {"numpy": {"version": "1"}, "gone": {"version": "2"}, "cascade-repro": {"version": "0"}}
    drift = package_drift(recorded, {"numpy": {"version": "1.1"}, "new": {"version": "3"}})
    assert [str(c) for c in drift] == ["gone 2 → (absent)", "new (absent) → 3", "numpy 1 → 1.1"]
