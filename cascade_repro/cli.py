"""The `cascade` command: parse → one api call → render. The only place exit codes are chosen.

Exit codes: 0 success; for `cascade run`, the script's own code; 1 error; 2 usage; 3 not reproduced
(`verify`, `restore`); 4 the script exited 0 but its record is incomplete or still pending delivery
(`run`, `sync`: see `cascade sync`); 130 interrupted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from cascade_repro import __version__

LOG_LEVELS = ("debug", "info", "warning", "error")


class _State:
    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose


def _guard(fn: Callable[[], int | None], ctx: click.Context, fast_exit: bool = False) -> None:
    """Run a command body; map CascadeError to its exit code, anything else to 1 (or the traceback).

    `fast_exit`: once the run is closed in the store, leave without interpreter teardown, which
    takes ~0.7 s with MLflow and SQLAlchemy loaded (a run's wall time is a measured target). Every
    store write is synchronous and already done; only stdio needs flushing.
    """
    from cascade_repro.errors import EXIT_ERROR, EXIT_INTERRUPTED, CascadeError

    state: _State = ctx.obj
    try:
        code = fn()
        if fast_exit:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code or 0)
    except CascadeError as exc:
        from cascade_repro import render

        render.error(exc.message)
        if exc.hint:
            sys.stderr.write(f"  hint: {exc.hint}\n")
        if state.verbose:
            raise
        ctx.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("cascade: interrupted\n")
        ctx.exit(EXIT_INTERRUPTED)
    except click.exceptions.Exit:
        raise
    except Exception as exc:
        if state.verbose:
            raise
        from cascade_repro import render

        render.error(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        sys.stderr.write("  run with -v for the traceback\n")
        ctx.exit(EXIT_ERROR)
    ctx.exit(code or 0)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """Send everything written to fd 1 (this process and its children) to stderr for a while."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cascade")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="warning",
    show_default=True,
    help="debug shows what was captured and why.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks of errors.")
@click.pass_context
def main(ctx: click.Context, log_level: str, verbose: bool) -> None:
    """cascade: record PyTorch training runs into MLflow and DVC, and reproduce them.

    \b
    cascade init                        set up this git repository
    cascade run train.py --epochs 3     record a run (script args pass through)
    cascade ls                          list runs
    cascade show RUN                    the full record of one run
    cascade verify RUN_A RUN_B          did B reproduce A? first divergent step and its causes
    cascade tag RUN v1.2.3              label a run with a version (MLflow tag + git tag)
    cascade restore v1.2.3              rebuild a version, re-run it, say whether it reproduced
    cascade checkout v1.2.3 --checkpoint best --to DIR   a checkpoint, md5-verified
    cascade diff v1.2.3 current         what differs: stack, code, params, packages, env, data, results
    cascade check v1.2.3                can this machine reproduce it bit for bit?
    cascade ui                          the MLflow UI on the same store, http://127.0.0.1:5000
    cascade sync                        deliver runs spooled while the store was unavailable
    cascade recover                     finish runs whose cascade process died (same as sync)
    cascade run --docker train.py       in the project's image (Dockerfile.j2), recorded with the run
    cascade image build                 build (or find) that image for the working tree
    """
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="cascade: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if log_level != "debug":
        for noisy in ("alembic", "mlflow", "dvc"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    ctx.obj = _State(verbose)


@main.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Set up cascade in this git repository (idempotent; never overwrites your files).

    Writes cascade.yaml and hyperparameters.yaml when missing, runs `dvc init` when needed,
    configures a local DVC remote, and adds ignore entries for the local MLflow store.
    """

    def body() -> None:
        from cascade_repro import api, render

        render.init_result(api.init())

    _guard(body, ctx)


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--params", "params_file", metavar="FILE", help="Params file (default: hyperparameters.yaml).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a param (YAML-typed).")
@click.option("--add", "adds", multiple=True, metavar="KEY=VALUE", help="Add a param not in the file.")
@click.option("--seed", metavar="N|random", help="Seed (default: `seed` in the params file, else 0).")
@click.option(
    "--deterministic",
    "determinism",
    type=click.Choice(["off", "warn", "strict"]),
    help="Determinism mode (default: cascade.yaml, else warn).",
)
@click.option("--name", "run_name", help="MLflow run name (default: generated).")
@click.option("--experiment", help="MLflow experiment (default: cascade.yaml, else the repo name).")
@click.option("--require-clean", is_flag=True, help="Refuse to run with uncommitted changes.")
@click.option(
    "--tag", "version", metavar="VERSION", help="Label the finished run with a version (e.g. v1.2.3)."
)
@click.option("--force-tag", "force_version", is_flag=True, help="Move VERSION here if another run has it.")
@click.option("--no-git-tag", "no_git_tag", is_flag=True, help="With --tag: no annotated git tag.")
@click.option("--log-checkpoints", is_flag=True, help="Also log checkpoint files as MLflow artifacts.")
@click.option(
    "--track-inputs",
    is_flag=True,
    help="Put files the script reads that neither git nor DVC tracks (e.g. ignored data) into the DVC cache.",
)
@click.option(
    "--trace-interval",
    type=int,
    metavar="N",
    help="Fingerprint every Nth optimizer step (default: cascade.yaml, else 1); 0: no trace.",
)
@click.option(
    "--nproc-per-node",
    type=int,
    metavar="N",
    help="Start N processes with torchrun (DDP: gloo on CPU, nccl on GPU); one run, every rank traced.",
)
@click.option("--docker/--no-docker", default=None, help="In the project's image (default: docker.enabled).")
@click.option("--gpus", metavar="all|none|N", help="With --docker: GPUs to give it (default: all there are).")
@click.option("--shm-size", metavar="SIZE", help="With --docker: shared memory, e.g. 8g (default: 1g).")
@click.option("--rebuild", "no_cache", is_flag=True, help="With --docker: build even if already built.")
@click.pass_context
def run(ctx: click.Context, script: str, script_args: tuple[str, ...], **options: Any) -> None:
    """Run SCRIPT with ARGS and record everything about it.

    Options go before SCRIPT; everything after SCRIPT is passed to it untouched. Exits with the
    script's own exit code.

    \b
    cascade run train.py --epochs 3
    cascade run --set optimizer.lr=1e-3 --seed 7 train.py
    cascade run --docker --gpus all train.py     in the project's image (templates/Dockerfile.j2)
    cascade run --nproc-per-node 2 train_ddp.py   torchrun, 2 ranks, one run
    torchrun --nproc-per-node 2 --no-python cascade run train_ddp.py   the same, torchrun yours
    """

    def body() -> int:
        from cascade_repro import api, render

        git_tag = not options.pop("no_git_tag")
        request = api.RunRequest(script=script, args=script_args, git_tag=git_tag, **options)
        result = api.run(request, notify=render.notice)
        render.run_result(result)
        if result.usage_error:
            misplaced = _misplaced_options(script, script_args, result.usage_error)
            if misplaced:
                render.misplaced_options(misplaced.options, misplaced.command)
        return result.exit_status

    _guard(body, ctx, fast_exit=True)


@dataclass(frozen=True)
class _Misplaced:
    options: list[str]  # cascade's options that the script's argparse refused, e.g. ["--seed"]
    command: str  # the command in the right order: `cascade run --seed 7 train.py`


def _misplaced_options(script: str, script_args: tuple[str, ...], usage_error: str) -> _Misplaced | None:
    """`cascade run train.py --seed 7`: the script's argparse refused `--seed`, an option of `cascade run`
    that went to the script because it came after it. None when it refused none of cascade's."""
    import re
    import shlex

    ours = {name: param for param in run.params if isinstance(param, click.Option)
            for name in (*param.opts, *param.secondary_opts)}  # fmt: skip
    refused = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", usage_error))
    moved: list[str] = []
    kept: list[str] = []
    index = 0
    while index < len(script_args):
        token = script_args[index]
        name = token.split("=", 1)[0]
        option = ours.get(name)
        if option is None or name not in refused:
            kept.append(token)
            index += 1
            continue
        takes_value = not option.is_flag and "=" not in token
        moved += script_args[index : index + 1 + takes_value]
        index += 1 + takes_value
    if not moved:
        return None
    names = list(dict.fromkeys(t.split("=", 1)[0] for t in moved if t.split("=", 1)[0] in ours))
    return _Misplaced(names, shlex.join(["cascade", "run", *moved, script, *kept]))


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


@main.command(name="ls")
@click.option("--all", "all_experiments", is_flag=True, help="Runs of every experiment in the store.")
@click.option("--versions", "versions_only", is_flag=True, help="Only runs that carry a version.")
@click.option("--limit", default=50, show_default=True, help="At most this many runs, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_command(ctx: click.Context, all_experiments: bool, versions_only: bool, limit: int,
                 as_json: bool) -> None:  # fmt: skip
    """List recorded runs: id, name, version, status, start, duration, commit, key metrics."""

    def body() -> None:
        from cascade_repro import api, render

        runs = api.list_runs(all_experiments=all_experiments, limit=limit, versions_only=versions_only)
        if as_json:
            render.emit_json("ls", [r.to_dict() for r in runs])
        else:
            render.run_list(runs, show_experiment=all_experiments, versions_only=versions_only)

    _guard(body, ctx)


@main.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--trace", "with_trace", is_flag=True, help="Summarize the step trace (steps, loss extremes).")
@click.option(
    "--checkpoints", "with_checkpoints", is_flag=True, help="Checkpoints: step, metrics, md5, kept/pruned."
)
@click.option("--json", "as_json", is_flag=True, help="The full record as JSON.")
@click.pass_context
def show(ctx: click.Context, run_ref: str, with_trace: bool, with_checkpoints: bool, as_json: bool) -> None:
    """Show the record of RUN (a run id, a unique prefix of one, a run name or a version)."""

    def body() -> None:
        from cascade_repro import api, render

        record = api.show_run(run_ref, trace=with_trace)
        if as_json:
            data = asdict(record)
            data["manifest"] = record.manifest.to_dict()
            render.emit_json("show", data)
        elif with_checkpoints:
            render.checkpoints(record.manifest.checkpoints)
        else:
            render.run_record(record)

    _guard(body, ctx)


@main.command()
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option(
    "--rtol", default=1e-5, show_default=True, help="Relative loss tolerance for NUMERICALLY_EQUIVALENT."
)
@click.option("--atol", default=1e-8, show_default=True, help="Absolute loss tolerance.")
@click.option("--no-record", is_flag=True, help="Do not tag the later run with the verdict.")
@click.option(
    "--replay",
    is_flag=True,
    help="Where tensors differ, re-run both runs up to that step (as cascade restore --steps does) and "
    "measure the difference: max |Δ| and how many elements.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable verdict.")
@click.pass_context
def verify(ctx: click.Context, run_a: str, run_b: str, rtol: float, atol: float, no_record: bool,
           replay: bool, as_json: bool) -> None:  # fmt: skip
    """Compare two runs step by step and say whether they reproduce each other.

    Exit 0: BITWISE_IDENTICAL or NUMERICALLY_EQUIVALENT; 3: DIVERGED or INCOMPARABLE; 1: error.
    """

    def body() -> int:
        from cascade_repro import api, render

        verdict = api.verify(run_a, run_b, rtol=rtol, atol=atol, record=not no_record, replay=replay,
                             notify=render.notice)  # fmt: skip
        if as_json:
            render.emit_json("verify", verdict.to_dict())
        else:
            render.verdict(verdict)
        return verdict.exit_status

    _guard(body, ctx)


@main.command(name="tag")
@click.argument("run_ref", metavar="RUN")
@click.argument("version")
@click.option("--force", is_flag=True, help="Move VERSION from the run that has it (the move is recorded).")
@click.option("--no-git-tag", is_flag=True, help="Only the MLflow tag, no annotated git tag.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def tag_command(ctx: click.Context, run_ref: str, version: str, force: bool, no_git_tag: bool,
                as_json: bool) -> None:  # fmt: skip
    """Label RUN with VERSION: the MLflow tag cascade.version and an annotated git tag at its commit."""

    def body() -> None:
        from cascade_repro import api, render

        result = api.tag(run_ref, version, force=force, git_tag=not no_git_tag)
        if as_json:
            render.emit_json("tag", asdict(result))
        else:
            render.tag_result(result)

    _guard(body, ctx)


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
    "--rtol", default=1e-5, show_default=True, help="Relative loss tolerance (class-A differences)."
)
@click.option("--atol", default=1e-8, show_default=True, help="Absolute loss tolerance.")
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
@click.option("--checkpoint", metavar="best|last|STEP|PATH",
              help="Which checkpoint (default: best by the monitored metric, else the last).")  # fmt: skip
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
                "chosen": {"path": chosen.entry.get("path"), "why": chosen.why} if chosen else None,
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
@click.pass_context
def push_command(ctx: click.Context, ref: str) -> None:
    """Push a run's kept checkpoints and data to the DVC remote (retries a failed push)."""

    def body() -> None:
        from cascade_repro import api, render

        result = api.push(ref)
        render.notice(f"pushed {result.pushed} object(s) of run {result.run_id[:12]} to {result.remote}")

    _guard(body, ctx)


@main.command(name="diff")
@click.argument("ref_a", metavar="A")
@click.argument("ref_b", metavar="B")
@click.option("--only", "only", multiple=True, metavar="SECTION",
              help="Only these sections: stack code params seed packages environment data container "
              "machine metrics checkpoints trace.")  # fmt: skip
@click.option("--log-to", metavar="RUN", help="Attach the diff report to RUN as an MLflow artifact.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable diff.")
@click.pass_context
def diff_command(ctx: click.Context, ref_a: str, ref_b: str, only: tuple[str, ...], log_to: str | None,
                 as_json: bool) -> None:  # fmt: skip
    """What differs between runs A and B (ids, names, versions, or `current`: this machine and tree).

    Sections are ordered by what matters for reproduction: class A (bitwise impossible), class B
    (likely root causes), class C (informational), then results.
    """

    def body() -> None:
        from cascade_repro import api, render

        result = api.diff(ref_a, ref_b, only=only, log_to=log_to)
        if as_json:
            render.emit_json("diff", result.to_dict())
        else:
            render.diff(result)

    _guard(body, ctx)


@main.command(name="check")
@click.argument("ref", metavar="[VERSION|RUN]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable findings.")
@click.pass_context
def check_command(ctx: click.Context, ref: str | None, as_json: bool) -> None:
    """Can this machine reproduce RUN bit for bit? Without RUN: is cascade set up on this machine?

    Exit 0: bitwise reproducible here (or all checks pass); 3: within tolerance only; 1: not
    runnable here (or a check failed).
    """

    def body() -> int:
        from cascade_repro import api, render

        report = api.check(ref)
        if as_json:
            render.emit_json("check", report.to_dict())
        else:
            render.check_report(report)
        return report.exit_status

    _guard(body, ctx)


@main.command(name="ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (0.0.0.0: all).")
@click.option("--port", default=5000, show_default=True, help="Port to serve on.")
@click.pass_context
def ui_command(ctx: click.Context, host: str, port: int) -> None:
    """The MLflow UI on this project's store (runs, params, metrics, cascade records). Ctrl-C stops it."""

    def body() -> int:
        from cascade_repro import api, render

        outcome = api.ui(host=host, port=port, started=render.ui_started)
        render.ui_stopped(outcome)
        return outcome.exit_status

    _guard(body, ctx)


if __name__ == "__main__":
    main()
