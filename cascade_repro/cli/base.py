"""The `cascade` group and what every command shares: the error guard (CascadeError → its exit
code, one line for anything else) and stdout kept clean for --json.

Exit codes: 0 success; for `cascade run`, the script's own code; 1 error; 2 usage; 3 not reproduced
(`verify`, `restore`); 4 the script exited 0 but its record is incomplete or still pending delivery
(`run`, `sync`: see `cascade sync`); 130 interrupted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Callable, ContextManager, Iterator

import click

from cascade_repro import __version__

LOG_LEVELS = ("debug", "info", "warning", "error")


# `ctx.obj` given by a caller that runs the command inside its own process (click's CliRunner in the
# tests): a finished `cascade run` then returns instead of leaving through os._exit.
IN_PROCESS = "in-process"


class _State:
    def __init__(self, verbose: bool, in_process: bool = False) -> None:
        self.verbose = verbose
        self.in_process = in_process


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
        if fast_exit and not state.in_process:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code or 0)
    except CascadeError as exc:
        from cascade_repro import render

        render.error(exc.message, hint=exc.hint)
        if state.verbose:
            raise
        ctx.exit(exc.exit_code)
    except KeyboardInterrupt:
        from cascade_repro import render

        render.interrupted()
        ctx.exit(EXIT_INTERRUPTED)
    except click.exceptions.Exit:
        raise
    except Exception as exc:
        if state.verbose:
            raise
        from cascade_repro import render

        first = str(exc).splitlines()[0] if str(exc) else ""
        said = f"{type(exc).__name__}: {first}" if first.strip() else type(exc).__name__
        render.error(said, then="run with -v for the traceback")
        ctx.exit(EXIT_ERROR)
    ctx.exit(code or 0)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[Callable[[], ContextManager[None]]]:
    """Send everything written to fd 1 (this process and its children) to stderr for a while; what it
    yields gives stdout back for a moment (`with own_stdout(): print JSON`)."""
    if not active:
        yield contextlib.nullcontext
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)

    @contextlib.contextmanager
    def own_stdout() -> Iterator[None]:
        sys.stdout.flush()
        os.dup2(saved, 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(2, 1)

    try:
        yield own_stdout
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
    _said_as_cascades_own(logging.getLogger("cascade_repro.recovery"))
    ctx.obj = _State(verbose, in_process=ctx.obj == IN_PROCESS)


def _said_as_cascades_own(logger: logging.Logger) -> None:
    """A read command's recovery of a dead run speaks in cascade's own lines ("cascade: recovered run
    ..."), not as log records ("cascade: WARNING cascade_repro.recovery: ..."); once per process."""
    if any(isinstance(handler, _ToStderr) for handler in logger.handlers):
        return
    handler = _ToStderr()
    handler.setFormatter(logging.Formatter("cascade: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


class _ToStderr(logging.StreamHandler):
    """Whatever sys.stderr is when a record comes (a command run in-process gets its own)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)
