"""`cascade run`: record a run of an unmodified script (its arguments pass through)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import click

from cascade_repro.cli.base import _guard, main


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "module", is_flag=True, help="SCRIPT is a module's name: run it as `python -m` does.")
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
    help="Put files the script reads that neither git nor DVC tracks (e.g. ignored data) into the DVC cache "
    "(needs `cascade init`).",
)
@click.option(
    "--trace-interval",
    type=int,
    metavar="N",
    help="Fingerprint every Nth optimizer step (default: cascade.yaml, else 1); 0: no trace.",
)
@click.option(
    "--trace-budget",
    type=float,
    metavar="SHARE",
    help="Fingerprint weights as often as this share of step time allows (default: cascade.yaml, else "
    "0.02); 0: every facet every step.",
)
@click.option(
    "--nproc-per-node",
    type=int,
    metavar="N",
    help="Start N processes with torchrun (DDP: gloo on CPU, nccl on GPU); one run, every rank traced.",
)
@click.option(
    "--nnodes",
    type=int,
    metavar="N",
    help="This machine is one of N nodes of a torchrun job: the same command on each (with --rdzv-endpoint).",
)
@click.option(
    "--rdzv-endpoint",
    metavar="HOST:PORT",
    help="With --nnodes: where the nodes meet (torchrun's c10d rendezvous; HOST one of them).",
)
@click.option("--rdzv-id", metavar="ID", help="With --nnodes: the job id (default: from commit and command).")
@click.option("--docker/--no-docker", default=None, help="In the project's image (default: docker.enabled).")
@click.option("--gpus", metavar="all|none|N", help="With --docker: GPUs to give it (default: all there are).")
@click.option("--shm-size", metavar="SIZE", help="With --docker: shared memory, e.g. 8g (default: 1g).")
@click.option("--rebuild", "no_cache", is_flag=True, help="With --docker: build even if already built.")
@click.pass_context
def run(ctx: click.Context, script: str, script_args: tuple[str, ...], module: bool, **options: Any) -> None:
    """Run SCRIPT with ARGS and record everything about it.

    Options go before SCRIPT; everything after SCRIPT is passed to it untouched. With -m, SCRIPT is a
    module of the repository, run by its name as `python -m` runs it (`cascade run -m mypkg.train`).
    Exits with the script's own exit code; 130 where Ctrl-C ended it (also where the script then failed
    another way); 4 where the script succeeded but the record is incomplete or still pending (a full
    disk, the store out of reach: `cascade show RUN` names what is missing, `cascade sync` delivers it).

    \b
    cascade run train.py --epochs 3
    cascade run --set optimizer.lr=1e-3 --seed 7 train.py
    cascade run --seed 7 -m mypkg.train --epochs 3   a module, as `python -m mypkg.train --epochs 3`
    cascade run --docker --gpus all train.py     in the project's image (templates/Dockerfile.j2)
    cascade run --nproc-per-node 2 train_ddp.py   torchrun, 2 ranks, one run
    torchrun --nproc-per-node 2 --no-python cascade run train_ddp.py   the same, torchrun yours
    cascade run --nnodes 2 --nproc-per-node 2 --rdzv-endpoint node1:29400 train_ddp.py   on each node
    """

    def body() -> int:
        from cascade_repro import api, render

        _refuse_script(script, module)
        git_tag = not options.pop("no_git_tag")
        request = api.RunRequest(script="" if module else script, module=script if module else None,
                                 args=script_args, git_tag=git_tag, **options)  # fmt: skip
        result = api.run(request, notify=render.notice)
        render.run_result(result)
        if result.usage_error:
            misplaced = _misplaced_options(["-m", script] if module else [script], script_args,
                                           result.usage_error)  # fmt: skip
            if misplaced:
                render.misplaced_options(misplaced.options, misplaced.command)
        from cascade_repro.api.runs import note_redirected_logs

        sys.stdout.flush()
        sys.stderr.flush()
        note_redirected_logs(result)  # `> run.log 2>&1`: as it is with the lines above in it
        return result.exit_status

    _guard(body, ctx, fast_exit=True)


def _refuse_script(script: str, module: bool) -> None:
    """What click took for SCRIPT but is not one: an unknown option of cascade run's own (everything
    before SCRIPT is cascade's), or a directory (not with -m: a package is one)."""
    from pathlib import Path

    from cascade_repro.errors import UsageError

    if script.startswith("-") and len(script) > 1:
        import difflib

        name = script.split("=", 1)[0]
        ours = sorted(name for param in run.params if isinstance(param, click.Option)
                      for name in (*param.opts, *param.secondary_opts) if name.startswith("--"))  # fmt: skip
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.8)
        raise UsageError(f"no such option: {name}" + (f"; did you mean {close[0]}?" if close else ""),
                         hint="`cascade run --help` lists its options; the script's own go after the script "
                         "(`cascade run train.py --epochs 3`)")  # fmt: skip
    if not module and Path(script).is_dir():
        inside = sorted(str(path) for path in Path(script).glob("*.py"))[:3]
        raise UsageError(
            f"{script} is a directory, not a script",
            hint="give the Python file to run" + (f": {', '.join(inside)}?" if inside else ""),
        )


@dataclass(frozen=True)
class _Misplaced:
    options: list[str]  # cascade's options that the script's argparse refused, e.g. ["--seed"]
    command: str  # the command in the right order: `cascade run --seed 7 train.py`


def _misplaced_options(target: list[str], script_args: tuple[str, ...],
                       usage_error: str) -> _Misplaced | None:  # fmt: skip
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
    return _Misplaced(names, shlex.join(["cascade", "run", *moved, *target, *kept]))
