"""`cascade init`, `cascade image build` and `cascade ui`: the project, its image, the UI on its store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cascade_repro.cli.base import _guard, main

if TYPE_CHECKING:
    from cascade_repro.project import InitResult


@main.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Set up cascade in this git repository (idempotent; never overwrites your files).

    Writes cascade.yaml and hyperparameters.yaml when missing, runs `dvc init` when needed,
    configures a local DVC remote, and adds ignore entries for the local MLflow store.
    """

    def body() -> None:
        from cascade_repro import api, render

        result = api.init()
        render.init_result(result, uncommitted=_uncommitted(result))

    _guard(body, ctx)


def _uncommitted(result: InitResult) -> list[str]:
    """The files of cascade's set-up (those init wrote or kept, .gitignore, DVC's) that git does not
    hold as they are: "commit these files" names them, and is not said when there are none."""
    from cascade_repro.store import git_repo

    paths = [*result.created, *result.kept, ".gitignore", ".dvc", ".dvcignore"]
    listed = git_repo.run(result.root, "status", "--porcelain", "-z", "--untracked-files=all", "--", *paths)
    if listed.returncode != 0:  # (not expected after a successful init: say commit, as before)
        return list(result.created) or [".gitignore"]
    entries = listed.stdout.decode("utf-8", "surrogateescape").split("\0")
    return sorted({entry[3:].split("/")[0] for entry in entries if len(entry) > 3})


@main.group(name="image")
def image() -> None:
    """The project's Docker image (templates/Dockerfile.j2; see `docker:` in cascade.yaml)."""


@image.command(name="build")
@click.option("--no-cache", is_flag=True, help="Build even if an image with the same inputs exists.")
@click.option("--json", "as_json", is_flag=True, help="The image's tag, ID and inputs as JSON.")
@click.pass_context
def image_build(ctx: click.Context, no_cache: bool, as_json: bool) -> None:
    """Build and tag the image for the working tree (cascade/<project>:<commit12>[-<content>]).

    Reused, not rebuilt, when an image with the same inputs (rendered Dockerfile, requirements,
    project files, cascade, base image) exists. The build log goes to .cascade/builds/.
    """

    def body() -> None:
        from cascade_repro import api, render

        prepared = api.build_image(no_cache=no_cache, notify=render.notice)
        if as_json:
            render.emit_json("image build", prepared.record())
        else:
            render.image_result(prepared)

    _guard(body, ctx)


@main.command(name="ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (0.0.0.0: all).")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535),
              help="Port to serve on.")  # fmt: skip
@click.pass_context
def ui_command(ctx: click.Context, host: str, port: int) -> None:
    """The MLflow UI on this project's store (runs, params, metrics, cascade records). Ctrl-C stops it."""

    def body() -> int:
        from cascade_repro import api, render

        outcome = api.ui(host=host, port=port, started=render.ui_started)
        render.ui_stopped(outcome)
        return outcome.exit_status

    _guard(body, ctx)
