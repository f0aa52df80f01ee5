"""`cascade image build`: build (or find) the image of the project as it is now, without running anything."""

from __future__ import annotations

from pathlib import Path

from cascade_repro.api.loading import load_project
from cascade_repro.capture.git import is_dirty
from cascade_repro.images.prepare import PreparedImage
from cascade_repro.run_engine import own_paths
from cascade_repro.run_plan import Notify
from cascade_repro.store.git_repo import head_commit


def build_image(
    cwd: Path | None = None, no_cache: bool = False, notify: Notify = lambda message: None
) -> PreparedImage:
    """The image `cascade run --docker` would use now: reused when its inputs are unchanged, else built."""
    from cascade_repro.capture.packages import capture_packages
    from cascade_repro.images import context as image_context
    from cascade_repro.images import engine, prepare

    settings = load_project(cwd)
    root = settings.root
    docker = image_context.docker_settings(settings.docker, root)
    client = engine.connect()
    exclude = own_paths(settings)
    dirty = bool(is_dirty(root, exclude))
    return prepare.prepare_image(
        client,
        root,
        docker,
        settings.experiment,
        head_commit(root),
        dirty,
        capture_packages(),
        settings.paths.builds,
        notify,
        no_cache=no_cache,
        exclude=exclude,
    )
