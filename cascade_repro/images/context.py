"""What an image is built from: `docker:` settings, the rendered Dockerfile, the build context and its hash.

The build context is a directory cascade assembles (never the repository itself, which holds the
MLflow store, the DVC cache and checkpoints): the rendered Dockerfile, the requirements, cascade's
own package source, the project's files as git sees them (tracked and untracked, not ignored), and
the optional wheelhouse and CA bundle. The inputs hash covers all of it plus the base image ID, so
an image with the same inputs is found by its label and reused, never rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cascade_repro.capture.git import excluded, sha256_of
from cascade_repro.capture.packages import installable
from cascade_repro.errors import CascadeError, ConfigError, DockerError
from cascade_repro.store import git_repo

DEFAULT_TEMPLATE = "Dockerfile.j2"
LOCK_FILES = ("requirements.lock", "requirements-lock.txt", "requirements.txt")
INPUTS_LABEL = "cascade.inputs"
# Never installed into the image from the captured package set: cascade itself is copied in (its
# child half needs only the standard library and torch), and the venv brings its own pip.
NOT_INSTALLED = {"cascade-repro", "pip", "setuptools", "wheel"}
GPU_CHOICES = ("auto", "all", "none")
# Builds with a local version label (2.5.1+cu124) are on PyTorch's own index, not on PyPI.
PYTORCH_INDEX_PACKAGES = {"torch", "torchvision", "torchaudio", "torchtext", "torchdata"}
KNOWN = {
    "enabled",
    "base_image",
    "dockerfile",
    "requirements",
    "wheelhouse",
    "ca_bundle",
    "offline",
    "gpus",
    "shm_size",
    "python",
    "network",
}


@dataclass(frozen=True)
class DockerSettings:
    """The `docker:` section of cascade.yaml, validated (`enabled` is read by `cascade run` itself, so a
    run without Docker never validates the build's paths)."""

    base_image: str | None = None  # default: matches this machine's Python and torch (see default_base_image)
    dockerfile: str = DEFAULT_TEMPLATE  # the project's template; cascade's own when the file is absent
    requirements: str | None = None  # default: the first of LOCK_FILES, else the captured packages
    wheelhouse: Path | None = None
    ca_bundle: Path | None = None
    offline: bool = False  # install from the wheelhouse only, no package index
    gpus: str = "auto"  # auto (all when the host has any) | all | none | a count
    shm_size: str = "1g"
    python: str = "python3"  # the base image's interpreter, used to create the venv
    network: str = "host"  # the build's and the container's network (host: a local tracking server answers)


def docker_settings(raw: Mapping[str, Any], root: Path) -> DockerSettings:
    unknown = sorted(set(raw) - KNOWN)
    if unknown:
        raise ConfigError(
            f"cascade.yaml: unknown docker setting(s) {', '.join(unknown)}",
            hint=f"known: {', '.join(sorted(KNOWN))}",
        )
    gpus = str(raw.get("gpus", "auto")).lower()
    if gpus not in GPU_CHOICES and not gpus.isdigit():
        raise ConfigError(f"docker.gpus must be auto, all, none or a number, not {gpus!r}")

    def path(key: str) -> Path | None:
        value = raw.get(key)
        if not value:
            return None
        resolved = (root / os.path.expanduser(str(value))).resolve()
        if not resolved.exists():
            raise ConfigError(
                f"docker.{key} {value} does not exist ({resolved})",
                hint=f"fix docker.{key} in cascade.yaml or remove it",
            )
        return resolved

    wheelhouse, ca_bundle = path("wheelhouse"), path("ca_bundle")
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ConfigError(f"docker.wheelhouse must be a directory of wheels, not {wheelhouse}")
    if raw.get("offline") and wheelhouse is None:
        raise ConfigError(
            "docker.offline needs docker.wheelhouse: without an index, pip installs from it only"
        )
    return DockerSettings(
        base_image=str(raw["base_image"]) if raw.get("base_image") else None,
        dockerfile=str(raw.get("dockerfile") or DEFAULT_TEMPLATE),
        requirements=str(raw["requirements"]) if raw.get("requirements") else None,
        wheelhouse=wheelhouse,
        ca_bundle=ca_bundle,
        offline=bool(raw.get("offline", False)),
        gpus=gpus,
        shm_size=str(raw.get("shm_size") or "1g"),
        python=str(raw.get("python") or "python3"),
        network=str(raw.get("network") or "host"),
    )


def default_base_image(torch_version: str | None) -> str:
    """An image matching this machine: PyTorch's runtime image for a CUDA torch, else slim Python."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    local = (torch_version or "").partition("+")[2]
    if local.startswith("cu") and local[2:].isdigit() and len(local) >= 5:
        cuda = f"{local[2:-1]}.{local[-1]}"
        return f"pytorch/pytorch:{torch_version.partition('+')[0]}-cuda{cuda}-cudnn9-runtime"  # type: ignore[union-attr]
    return f"python:{python}-slim"


@dataclass(frozen=True)
class Requirements:
    text: str
    source: str  # the lock file's path, or "captured packages"
    left_out: tuple[str, ...] = ()


def project_requirements(
    root: Path, configured: str | None, packages: Mapping[str, Mapping[str, Any]]
) -> Requirements:
    """The project's lock file, or else the captured package set filtered to what an index can install."""
    if configured:
        path = root / configured
        if not path.is_file():
            raise ConfigError(
                f"docker.requirements {configured} does not exist in {root}",
                hint="fix docker.requirements in cascade.yaml (or remove it: the captured packages)",
            )
        return Requirements(path.read_text(encoding="utf-8"), configured)
    for name in LOCK_FILES:
        if (root / name).is_file():
            return Requirements((root / name).read_text(encoding="utf-8"), name)
    return requirements_from_packages(packages)


def requirements_from_packages(packages: Mapping[str, Mapping[str, Any]]) -> Requirements:
    lines, left_out, indexes = [], [], set()
    for name, info in sorted(packages.items()):
        if name in NOT_INSTALLED or not installable(name, info.get("version")):
            continue
        if info.get("origin"):  # editable, VCS, local archive or bare egg-info: no index has it
            left_out.append(f"{name} ({info['origin']})")
            continue
        version = str(info.get("version"))
        lines.append(f"{name}=={version}")
        local = version.partition("+")[2]
        if name in PYTORCH_INDEX_PACKAGES and (local == "cpu" or re.fullmatch(r"cu\d+|rocm[\d.]+", local)):
            indexes.add(
                f"--extra-index-url https://download.pytorch.org/whl/{local}"
            )  # +cpu, +cu121 live there
    header = "# cascade: the packages of the recording environment (no lock file in the project)\n"
    options = "".join(f"{line}\n" for line in sorted(indexes))
    return Requirements(header + options + "\n".join(lines) + "\n", "captured packages", tuple(left_out))


@dataclass(frozen=True)
class BuildContext:
    """What an image is built from: hashed from the sources, written out only when a build is needed."""

    dockerfile: str  # rendered
    dockerfile_sha256: str
    requirements: Requirements
    sources: tuple[tuple[str, Path], ...]  # (path in the context, file or symlink on this machine)
    inputs_sha256: str
    tag: str
    base_image: str
    base_image_id: str | None

    def write(self, directory: Path) -> None:
        """The build context in `directory` (empty): wheels hardlinked, everything else copied."""
        (directory / "Dockerfile").write_text(self.dockerfile, encoding="utf-8")
        (directory / "requirements.txt").write_text(self.requirements.text, encoding="utf-8")
        (directory / "project").mkdir()
        for rel, source in self.sources:
            target = directory / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_symlink():
                os.symlink(os.readlink(source), target)
                continue
            if rel.startswith("wheelhouse/"):
                try:
                    os.link(source, target)
                    continue
                except OSError:
                    pass
            shutil.copy2(source, target)


def render_dockerfile(template: str, settings: DockerSettings, base_image: str) -> str:
    import jinja2

    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True
    )
    try:
        return env.from_string(template).render(
            base_image=base_image,
            requirements="requirements.txt",
            wheelhouse="wheelhouse" if settings.wheelhouse else "",
            ca_bundle="ca.pem" if settings.ca_bundle else "",
            offline=settings.offline,
            python=settings.python,
            child_extras=" ".join(child_extras()),
        )
    except jinja2.TemplateError as exc:
        raise ConfigError(
            f"{settings.dockerfile}: the Dockerfile template does not render: {exc}",
            hint="fix the template, or delete it to use cascade's own",
        ) from None


def child_extras() -> list[str]:
    """What the child uses when installed, pinned to this machine's versions (traces stay comparable)."""
    from cascade_repro.capture.packages import installed_version

    version = installed_version("xxhash")
    return [f"xxhash=={version}"] if version else []


def template_text(root: Path, settings: DockerSettings) -> str:
    from cascade_repro.project import template_path

    own = root / settings.dockerfile
    if own.is_file():
        return own.read_text(encoding="utf-8")
    if settings.dockerfile != DEFAULT_TEMPLATE:
        raise ConfigError(f"docker.dockerfile {settings.dockerfile} does not exist in {root}")
    return template_path(DEFAULT_TEMPLATE).read_text(encoding="utf-8")


def collect(
    root: Path,
    settings: DockerSettings,
    dockerfile: str,
    requirements: Requirements,
    project: str,
    commit: str,
    dirty: bool,
    base_image: str,
    base_image_id: str | None,
    exclude: tuple[str, ...] = (),
) -> BuildContext:
    """The build context's sources and their hash (rendered Dockerfile, requirements, cascade's package,
    the project's files as git sees them, the wheelhouse by name and size, the CA bundle, the base ID)."""
    package = Path(__file__).resolve().parent.parent
    sources = [
        (f"cascade/cascade_repro/{path.relative_to(package).as_posix()}", path)
        for path in sorted(package.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        and "templates" not in path.relative_to(package).parts
    ]  # fmt: skip
    sources += [(f"project/{rel}", root / rel) for rel in project_files(root, exclude)]
    if settings.wheelhouse is not None:
        wheels = sorted(p for p in settings.wheelhouse.rglob("*") if p.is_file())
        sources += [(f"wheelhouse/{p.relative_to(settings.wheelhouse).as_posix()}", p) for p in wheels]
    if settings.ca_bundle is not None:
        sources.append(("ca.pem", settings.ca_bundle))
    digest = hashlib.sha256()
    digest.update(f"base {base_image} {base_image_id}\n".encode())
    for name, text in (("Dockerfile", dockerfile), ("requirements.txt", requirements.text)):
        digest.update(f"{name} {hashlib.sha256(text.encode()).hexdigest()}\n".encode())
    project_digest = hashlib.sha256()
    for rel, path in sorted(sources):
        if rel.startswith("wheelhouse/"):  # wheels are named by version: name and size suffice
            line = f"{rel} {path.stat().st_size}\n".encode()
        elif path.is_symlink():
            line = f"{rel} -> {os.readlink(path)}\n".encode()
        else:
            line = f"{rel} {os.stat(path).st_mode & 0o111:o} {sha256_of(path)}\n".encode()
        digest.update(line)
        if rel.startswith("project/"):
            project_digest.update(line)
    suffix = f"-{project_digest.hexdigest()[:8]}" if dirty else ""
    return BuildContext(
        dockerfile=dockerfile,
        dockerfile_sha256=hashlib.sha256(dockerfile.encode()).hexdigest(),
        requirements=requirements,
        sources=tuple(sources),
        inputs_sha256=digest.hexdigest(),
        tag=f"{image_repository(project)}:{commit[:12]}{suffix}",
        base_image=base_image,
        base_image_id=base_image_id,
    )


def image_repository(project: str) -> str:
    """`cascade/<project>`, the project's name made a valid Docker repository name."""
    name = re.sub(r"[^a-z0-9._-]+", "-", project.lower())
    name = re.sub(r"[._-]{2,}", "-", name).strip("._-") or "project"  # one separator at a time
    return f"cascade/{name[:100]}"


def project_files(root: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    """Files git sees in the working tree: tracked (as they are now) and untracked, not ignored, minus
    cascade's own (`exclude`: the store, run scratch; never part of the image even when not ignored)."""
    try:
        names = sorted(set(git_repo.visible_files(root)))
    except CascadeError as exc:
        raise DockerError(f"cannot list the project's files: {exc.message}") from None
    return [
        n for n in names if not excluded(n, exclude) and ((root / n).is_file() or (root / n).is_symlink())
    ]
