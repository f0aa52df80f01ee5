"""Reading recorded runs: `cascade ls`, `show`, `verify`, `tag`, `diff`, `check`."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from cascade_repro.cli.base import _guard, _stdout_to_stderr, main
from cascade_repro.determinism.tolerances import DEFAULT_ATOL, DEFAULT_RTOL

if TYPE_CHECKING:
    from cascade_repro.determinism.verdict import Verdict


@main.command(name="ls")
@click.option("--all", "all_experiments", is_flag=True, help="Runs of every experiment in the store.")
@click.option("--versions", "versions_only", is_flag=True, help="Only runs that carry a version.")
@click.option("--user", metavar="NAME", help="Only runs started by this user (e.g. --user $USER).")
@click.option("--running", is_flag=True, help="Only runs still RUNNING (stale ones marked).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1),
              help="At most this many runs, newest first.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_command(ctx: click.Context, all_experiments: bool, versions_only: bool, user: str | None,
                 running: bool, limit: int, as_json: bool) -> None:  # fmt: skip
    """List recorded runs: id, name, version, status, user, start, duration, commit, key metrics.

    A RUNNING run whose cascade process has not told the store it is alive for three minutes is
    STALE: its process died or cannot reach the store (on this machine, any cascade command
    finishes a run whose process died)."""

    def body() -> None:
        from cascade_repro import api, render

        runs = api.list_runs(all_experiments=all_experiments, limit=limit, versions_only=versions_only,
                             user=user, running=running)  # fmt: skip
        if as_json:
            render.emit_json("ls", [r.to_dict() for r in runs])
        else:
            render.run_list(runs, show_experiment=all_experiments, versions_only=versions_only,
                            filtered=user is not None or running)  # fmt: skip

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
            data.update(run_id=record.manifest.run_id, name=record.tags.get("mlflow.runName"),
                        version=record.tags.get("cascade.version"))  # fmt: skip
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
    "--rtol",
    default=DEFAULT_RTOL,
    show_default=True,
    help="Relative loss tolerance for NUMERICALLY_EQUIVALENT.",
)
@click.option("--atol", default=DEFAULT_ATOL, show_default=True, help="Absolute loss tolerance.")
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

        # the replays' output must not corrupt the JSON on stdout
        with _stdout_to_stderr(as_json and replay) as own_stdout:

            def show(verdict: Verdict) -> None:  # on the screen before it is recorded
                with own_stdout():
                    if as_json:
                        render.emit_json("verify", verdict.to_dict())
                    else:
                        render.verdict(verdict)
                    sys.stdout.flush()

            verdict = api.verify(run_a, run_b, rtol=rtol, atol=atol, record=not no_record, replay=replay,
                                 notify=render.notice, shown=show)  # fmt: skip
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


@main.command(name="diff")
@click.argument("ref_a", metavar="A")
@click.argument("ref_b", metavar="B")
@click.option("--only", "only", multiple=True, metavar="SECTION",
              help="Only these sections (repeat it, or separate them with commas): stack code params seed "
              "packages environment data container machine metrics checkpoints trace.")  # fmt: skip
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

        sections = tuple(part.strip() for given in only for part in given.split(",") if part.strip())
        result = api.diff(ref_a, ref_b, only=sections, log_to=log_to)
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
