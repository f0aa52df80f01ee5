"""The Docker engine through the Docker SDK: connect, find or build an image, inspect it, probe its Python.

Errors from the SDK are translated here into DockerError with the fix: no engine ("start Docker or
run without --docker"), a base image that cannot be had, a failed build (its log kept and named).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cascade_repro.errors import DockerError
from cascade_repro.images.context import INPUTS_LABEL, BuildContext

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
# Printed by the probe: the image's Python and packages, read as `cascade run` reads the host's.
PROBE = (
    "import json; from cascade_repro.capture.packages import capture_python; "
    "print(json.dumps(capture_python()))"
)


def connect(timeout_s: float = 120) -> Any:
    """A Docker SDK client for the engine at DOCKER_HOST (default: the local socket), checked to answer."""
    try:
        import docker
    except ImportError:
        raise DockerError("the Docker SDK for Python is not installed", hint="pip install docker") from None
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as exc:
        raise DockerError(
            f"no Docker engine answers at {where} ({_reason(exc)})",
            hint="start Docker (`dockerd &`, or `systemctl start docker`) or run without --docker",
        ) from None
    return client


def engine_answers(timeout_s: float = 10) -> bool:
    """Whether a Docker engine answers at DOCKER_HOST (`cascade check`'s probe; never raises)."""
    try:
        connect(timeout_s).close()
    except DockerError:
        return False
    return True


@dataclass(frozen=True)
class Image:
    """An image on the engine: what the record says about it."""

    tag: str
    image_id: str
    repo_digest: str | None
    built: bool  # False: an image with the same inputs was already there
    build_s: float = 0.0


def local_image(client: Any, ref: str) -> Any | None:
    """A local image by tag or ID, or None."""
    import docker

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise DockerError(f"the Docker engine refused to inspect {ref}: {_reason(exc)}") from None


def image_id(client: Any, ref: str) -> str | None:
    """The ID of a local image by tag or ID, or None."""
    found = local_image(client, ref)
    return None if found is None else str(found.id)


def find_built(client: Any, inputs_sha256: str) -> Any | None:
    """A local image built from exactly these inputs (by cascade's label), newest first."""
    found = client.images.list(filters={"label": f"{INPUTS_LABEL}={inputs_sha256}"})
    return found[0] if found else None


def ensure_base(client: Any, base_image: str, progress: Progress) -> str:
    """The base image's ID, pulled when it is not here; a clear error when it cannot be had."""
    have = image_id(client, base_image)
    if have:
        return have
    progress(f"pulling the base image {base_image}")
    try:
        return str(client.images.pull(base_image).id)
    except Exception as exc:
        raise DockerError(
            f"the base image {base_image} is not here and cannot be pulled ({_reason(exc)})",
            hint="`docker pull` or `docker load` it, or set docker.base_image in cascade.yaml to one here",
        ) from None


def build_or_reuse(
    client: Any,
    context: BuildContext,
    network: str,
    log_path: Path,
    progress: Progress,
    no_cache: bool = False,
) -> Image:
    """Reuse an image with the same inputs (tagging it), else build one; the build log goes to log_path."""
    existing = None if no_cache else find_built(client, context.inputs_sha256)
    if existing is not None:
        existing.tag(*context.tag.split(":", 1))
        log.debug("reusing %s for inputs %s", existing.id, context.inputs_sha256[:12])
        return Image(context.tag, str(existing.id), repo_digest(existing), built=False)
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    built_id: str | None = None
    failure: str | None = None
    labels = {
        INPUTS_LABEL: context.inputs_sha256,
        "cascade.dockerfile": context.dockerfile_sha256,
        "cascade.base_image": context.base_image,
    }
    progress(f"building {context.tag}")
    with (
        open(log_path, "w", encoding="utf-8") as build_log,
        tempfile.TemporaryDirectory(prefix="cascade-build-") as directory,
    ):
        try:
            context.write(Path(directory))
            stream = client.api.build(
                path=directory,
                tag=context.tag,
                labels=labels,
                rm=True,
                forcerm=True,
                decode=True,
                network_mode=network,
                nocache=no_cache,
            )
            for chunk in stream:
                text = chunk.get("stream") or chunk.get("status") or ""
                if text:
                    build_log.write(text if text.endswith("\n") else text + "\n")
                    if text.startswith("Step "):
                        progress(text.strip())
                if "error" in chunk:
                    failure = str(chunk["error"]).strip()
                    build_log.write(f"ERROR: {failure}\n")
                aux = chunk.get("aux") or {}
                if aux.get("ID"):
                    built_id = str(aux["ID"])
        except Exception as exc:
            failure = _reason(exc)
            build_log.write(f"ERROR: {failure}\n")
    if failure or not built_id:
        raise DockerError(
            f"building {context.tag} failed: {_last_line(failure or 'no image ID reported')}",
            hint=f"the full build log is {log_path}; fix the Dockerfile template or the requirements",
        )
    image = client.images.get(built_id)
    return Image(
        context.tag,
        str(image.id),
        repo_digest(image),
        built=True,
        build_s=round(time.monotonic() - started, 2),
    )


def probe_python(client: Any, image_ref: str, cache_dir: Path) -> dict[str, Any]:
    """The Python and packages inside an image (one `docker run`, cached by image ID afterwards)."""
    resolved = image_ref if image_ref.startswith("sha256:") else image_id(client, image_ref)
    if resolved is None:
        raise DockerError(
            f"the image {image_ref} is not on this engine", hint="build it: cascade image build"
        )
    cached = cache_dir / f"{resolved.replace(':', '-').replace('/', '_')}.json"
    try:
        return dict(json.loads(cached.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    try:
        out = client.containers.run(
            resolved,
            ["python", "-c", PROBE],
            remove=True,
            stdout=True,
            stderr=False,
            network_mode="none",
            entrypoint=[],
        )
        found = json.loads(out.decode("utf-8").strip().splitlines()[-1])
    except Exception as exc:
        raise DockerError(
            f"cannot read the packages inside {image_ref}: {_reason(exc)}",
            hint="the image must have `python` on its PATH with cascade in it (see Dockerfile.j2)",
        ) from None
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(found), encoding="utf-8")
    os.replace(tmp, cached)
    return dict(found)


def engine_version(client: Any) -> str | None:
    try:
        return str(client.version().get("Version"))
    except Exception:
        return None


def repo_digest(image: Any) -> str | None:
    digests = image.attrs.get("RepoDigests") or []
    return str(digests[0]) if digests else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _reason(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    text = str(explanation or exc).strip()
    return _last_line(text)[:300] or type(exc).__name__
