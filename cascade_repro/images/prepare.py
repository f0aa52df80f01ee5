"""Get the image a run executes in: render, hash the inputs, reuse or build; and pick its GPUs.

prepare_image(...)   → PreparedImage (the image and everything the record says about it)
recorded_image(...)  → the image a record names, when the engine still has it (restore: 0 builds)
package_drift(...)   → what a rebuilt image installs differently from the record
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from cascade_repro.errors import DockerError, UsageError
from cascade_repro.images import context as ctx
from cascade_repro.images import engine
from cascade_repro.images.engine import Image, Progress


@dataclass(frozen=True)
class PreparedImage:
    """The image a run uses: found by its inputs or built, its ID and digest, how it was had."""

    image: Image
    dockerfile: str
    dockerfile_sha256: str
    requirements: str
    requirements_source: str
    inputs_sha256: str | None
    base_image: str | None
    base_image_id: str | None
    engine_version: str | None
    reused_by_id: bool = False  # restore found the recorded image itself
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def record(self) -> dict[str, Any]:
        """The manifest's `container` section for a run executed in this image."""
        return {
            "runtime": "docker",
            "in_container": True,
            "image": self.image.tag,
            "image_id": self.image.image_id,
            "repo_digest": self.image.repo_digest,
            "built": self.image.built,
            "build_s": self.image.build_s,
            "dockerfile_sha256": self.dockerfile_sha256,
            "dockerfile_artifact": "cascade/Dockerfile",
            "requirements_source": self.requirements_source,
            "requirements_artifact": "cascade/requirements.txt",
            "inputs_sha256": self.inputs_sha256,
            "base_image": self.base_image,
            "base_image_id": self.base_image_id,
            "engine_version": self.engine_version,
        }


def prepare_image(
    client: Any,
    root: Path,
    settings: ctx.DockerSettings,
    project: str,
    commit: str,
    dirty: bool,
    packages: Mapping[str, Mapping[str, Any]],
    log_dir: Path,
    progress: Progress,
    dockerfile: str | None = None,
    requirements: ctx.Requirements | None = None,
    base_image: str | None = None,
    no_cache: bool = False,
    exclude: tuple[str, ...] = (),
) -> PreparedImage:
    """The image for the project at `root` as it is now; reused when one with the same inputs exists.

    `dockerfile` / `requirements` / `base_image` replace the template, the lock file and the configured
    base (restore rebuilds from the record's own).
    """
    from cascade_repro.capture.packages import installed_version

    base = base_image or settings.base_image or ctx.default_base_image(installed_version("torch"))
    base_id = engine.ensure_base(client, base, progress)
    rendered = (
        dockerfile
        if dockerfile is not None
        else ctx.render_dockerfile(ctx.template_text(root, settings), settings, base)
    )
    reqs = requirements or ctx.project_requirements(root, settings.requirements, packages)
    warnings = []
    if reqs.source == "captured packages":
        warnings.append(
            "no lock file (requirements.lock or requirements.txt) in the project: the image installs the "
            "packages of this environment"
            + (f", except {', '.join(reqs.left_out[:5])}" if reqs.left_out else "")
            + "; keep a lock file (or set docker.requirements) for an image you control"
        )
    built = ctx.collect(root, settings, rendered, reqs, project, commit, dirty, base, base_id, exclude)
    log_path = log_dir / f"{built.tag.replace('/', '_').replace(':', '_')}.log"
    image = engine.build_or_reuse(client, built, settings.network, log_path, progress, no_cache=no_cache)
    return PreparedImage(
        image,
        rendered,
        built.dockerfile_sha256,
        reqs.text,
        reqs.source,
        built.inputs_sha256,
        base,
        base_id,
        engine.engine_version(client),
        warnings=tuple(warnings),
    )


def recorded_image(
    client: Any, container: Mapping[str, Any], dockerfile: str, requirements: str
) -> PreparedImage | None:
    """The image a record names, by ID, when this engine has it."""
    wanted = str(container.get("image_id") or "")
    found = engine.local_image(client, wanted) if wanted else None
    if found is None or found.id != wanted:
        return None
    image = Image(str(container.get("image") or wanted), wanted, engine.repo_digest(found), built=False)
    return PreparedImage(
        image,
        dockerfile,
        str(container.get("dockerfile_sha256") or ""),
        requirements,
        str(container.get("requirements_source") or "recorded"),
        container.get("inputs_sha256"),
        container.get("base_image"),
        container.get("base_image_id"),
        engine.engine_version(client),
        reused_by_id=True,
    )


@dataclass(frozen=True)
class PackageChange:
    """A package whose version in a rebuilt image differs from the record's."""

    name: str
    recorded: str | None
    now: str | None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def __str__(self) -> str:
        return f"{self.name} {self.recorded or '(absent)'} → {self.now or '(absent)'}"


def package_drift(
    recorded: Mapping[str, Mapping[str, Any]], now: Mapping[str, Mapping[str, Any]]
) -> list[PackageChange]:
    """Packages whose version differs between a record and an image (cascade itself left out)."""
    names = sorted((set(recorded) | set(now)) - {"cascade-repro"})
    changes = []
    for name in names:
        a = (recorded.get(name) or {}).get("version")
        b = (now.get(name) or {}).get("version")
        if a != b:
            changes.append(PackageChange(name, a, b))
    return changes


def choose_gpus(wanted: str, host_gpus: int) -> str | int | None:
    """`auto`: every GPU the host has (maybe none); `all`/N on a host without GPUs is an error."""
    if wanted not in ("auto", "all", "none") and not (wanted.isdigit() and int(wanted) >= 0):
        raise UsageError(f"--gpus takes all, none, auto or a number of GPUs, not {wanted!r}",
                         hint="e.g. --gpus all, or --gpus 1")  # fmt: skip
    if wanted in ("none", "0") or (wanted == "auto" and host_gpus == 0):
        return None
    if wanted == "auto":
        return "all"
    if host_gpus == 0:
        raise DockerError(
            f"GPUs were asked for (--gpus {wanted}) but this machine has none (nvidia-smi finds no GPU)",
            hint="drop --gpus (or set docker.gpus: auto) to run on the CPU, or run on a machine with a GPU",
        )
    if wanted != "all" and int(wanted) > host_gpus:
        raise DockerError(
            f"--gpus {wanted} asks for more GPUs than this machine has ({host_gpus})",
            hint=f"ask for at most {host_gpus}, or --gpus all",
        )
    return "all" if wanted == "all" else int(wanted)
