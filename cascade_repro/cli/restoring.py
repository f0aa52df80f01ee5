"""Bringing runs back: `cascade restore`, `checkout`, `push`, and `sync`/`recover` for spooled runs."""

from __future__ import annotations

from pathlib import Path

import click

from cascade_repro.cli.base import _guard, _stdout_to_stderr, main
from cascade_repro.determinism.tolerances import DEFAULT_ATOL, DEFAULT_RTOL


@main.command()
@click.argument("ref", metavar="VERSION|RUN")
@click.option("--no-run", is_flag=True, help="Only materialize code and state; print how to run it.")
@click.option(
    "--steps", type=int, metavar="N", help="Re-run only the first N optimizer steps and verify them."
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the worktree goes (default: .cascade/restore/VERSION in this repository).",
)
@click.option(
    "--rtol", default=DEFAULT_RTOL, show_default=True, help="Relative loss tolerance (class-A differences)."
)
@click.option("--atol", default=DEFAULT_ATOL, show_default=True, help="Absolute loss tolerance.")
@click.option("--json", "as_json", is_flag=True, help="Plan, run and verdict as JSON on stdout.")
@click.option("--docker", is_flag=True, help="Re-run in the recorded image (rebuilt if gone).")
@click.option("--gpus", metavar="all|none|N", help="With --docker: GPUs to give it (default: all there are).")
@click.pass_context
def restore(ctx: click.Context, ref: str, no_run: bool, steps: int | None, workdir: Path | None, rtol: float,
            atol: float, as_json: bool, docker: bool, gpus: str | None) -> None:  # fmt: skip
    """Rebuild a recorded run (code, dirty state) in an isolated git worktree, re-run it, verify it.

    \b
    cascade restore v1.2.3               rebuild, re-run, verdict
    cascade restore v1.2.3 --steps 50    re-run a prefix and verify it
    cascade restore v1.2.3 --no-run      just materialize the worktree
    cascade restore v1.2.3 --docker      in the recorded image (0 builds when it is here)

    Exit 0: reproduced (bitwise, or within tolerance where this machine differs in class A);
    3: not reproduced; 1: error. Your checkout is never touched.
    """

    def body() -> int:
        from cascade_repro import api, render

        with _stdout_to_stderr(as_json):  # the re-run's output must not corrupt the JSON on stdout
            result = api.restore(
                ref, workdir=workdir, steps=steps, execute=not no_run, rtol=rtol, atol=atol,
                notify=render.notice, show_plan=(lambda plan: None) if as_json else render.restore_plan,
                docker=docker, gpus=gpus,
            )  # fmt: skip
        if as_json:
            render.emit_json("restore", render.restore_dict(result))
        else:
            render.restore_result(result)
        return result.exit_status

    _guard(body, ctx)


@main.command(name="checkout")
@click.argument("ref", metavar="RUN|VERSION")
@click.option("--checkpoint", metavar="best|last|STEP|PATH|MD5",
              help="Which checkpoint (default: best by the monitored metric, else the last; a path "
                   "saved many times: its last version, or one by the md5 `show --checkpoints` prints).")
@click.option("--data", is_flag=True, help="The DVC-tracked data the run read, as it read it.")
@click.option("--to", type=click.Path(file_okay=False, path_type=Path), help="Write into DIR, not in place.")
@click.option("--force", is_flag=True, help="Overwrite a file with other content.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def checkout_command(ctx: click.Context, ref: str, checkpoint: str | None, data: bool, to: Path | None,
                     force: bool, as_json: bool) -> None:  # fmt: skip
    """Fetch a run's checkpoint or data from the DVC cache or remote, md5-verified.

    \b
    cascade checkout v1.2.3 --checkpoint best --to ./restored/
    cascade checkout 3f2a9c1e --data
    """

    def body() -> None:
        from cascade_repro import api, render

        with render.byte_progress() as progress:
            result = api.checkout(
                ref, checkpoint=checkpoint, data=data, to=to, force=force, progress=progress
            )
        if as_json:
            chosen = result.chosen
            render.emit_json("checkout", {
                "run_id": result.run_id, "items": [i.to_dict() for i in result.items],
                "chosen": {"path": chosen.entry.path, "why": chosen.why} if chosen else None,
                "not_kept": list(result.not_kept),
            })  # fmt: skip
        else:
            render.checkout_result(result)

    _guard(body, ctx)


def _sync(ctx: click.Context, as_json: bool, command: str) -> None:
    def body() -> int:
        from cascade_repro import api, render

        result = api.sync(notify=render.notice, command=command)
        if as_json:
            render.emit_json(command, [d.to_dict() for d in result.delivered])
        else:
            render.sync_result(list(result.delivered))
        return result.exit_status

    _guard(body, ctx)


@main.command(name="sync")
@click.option("--json", "as_json", is_flag=True, help="What was delivered, per run, as JSON.")
@click.pass_context
def sync_command(ctx: click.Context, as_json: bool) -> None:
    """Deliver what runs left in .cascade/runs/ while the store was unavailable or full.

    Points, output, trace and record go to the store from where delivery stopped; a run is closed
    with its real status once all of it is stored. Exit 0: nothing left pending; 4: some of it is
    still pending (the store does not answer yet) or was refused (named).
    """
    _sync(ctx, as_json, "sync")


@main.command(name="recover")
@click.option("--json", "as_json", is_flag=True, help="What was delivered, per run, as JSON.")
@click.pass_context
def recover_command(ctx: click.Context, as_json: bool) -> None:
    """Finish runs whose `cascade run` process died (SIGKILL, OOM killer, closed terminal).

    What the script wrote is delivered and the run closed KILLED (or as the script ended), its
    record saying what happened and what is missing. Every store command does this first; this is
    `cascade sync` under the name one looks for after a crash. Exit codes as for sync.
    """
    _sync(ctx, as_json, "recover")


@main.command(name="push")
@click.argument("ref", metavar="RUN|VERSION")
@click.option("--json", "as_json", is_flag=True, help="What was pushed, as JSON.")
@click.pass_context
def push_command(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Push a run's kept checkpoints and data to the DVC remote (retries a failed push).

    Exit 0: pushed, or nothing to push (the run kept no checkpoints and read no DVC data); 1: error.
    """

    def body() -> None:
        from cascade_repro import api, render

        render.push_result(api.push(ref), as_json)

    _guard(body, ctx)
