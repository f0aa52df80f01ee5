"""What `run`, `init`, `ls`, `show`, `tag`, `sync`, `image build` and `ui` print."""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from cascade_repro.child.trace_budget import FULL_RECORDS, parse_schedule
from cascade_repro.errors import signal_name
from cascade_repro.record_sections import error_line
from cascade_repro.redaction import redact_text
from cascade_repro.render.console import _console, _num, _size, _styled, _time, error, notice, one_line
from cascade_repro.settings import is_tracking_server

if TYPE_CHECKING:
    from cascade_repro.api.browsing import RunSummary
    from cascade_repro.api.records import RunRecord
    from cascade_repro.images.prepare import PreparedImage
    from cascade_repro.manifest import Manifest
    from cascade_repro.project import InitResult
    from cascade_repro.record_sections import (
        CheckpointEntry,
        ContainerSection,
        FileEntry,
        GitSection,
        TorchSection,
    )
    from cascade_repro.recovery import Delivered
    from cascade_repro.run_plan import RunResult
    from cascade_repro.store.ui_server import UiOutcome, UiServer
    from cascade_repro.versions import TagResult


def init_result(result: InitResult, uncommitted: Sequence[str] = ()) -> None:
    """`cascade init`: what was created, what was kept as it was, DVC and its remote; `uncommitted`:
    cascade's files that git does not have as they are, to commit next."""
    console = _console()
    console.print(_styled(("cascade project", "bold"), f" at {result.root}"))
    for name in result.created:
        console.print(f"  created  {name}")
    for name in result.kept:
        console.print(f"  kept     {name} (already there; not overwritten)")
    if result.dvc_initialized:
        console.print("  ran      dvc init")
    if result.dvc_remote:
        console.print(f"  dvc remote: {result.dvc_remote}")
    if result.ignore_added:
        console.print(f"  .gitignore += {' '.join(result.ignore_added)}")
    if uncommitted:
        console.print(f"next: commit these files ({' '.join(uncommitted)}), then `cascade run train.py`")
    else:
        console.print("next: `cascade run train.py`")


def _part_of_a_job(result: RunResult) -> None:
    """Rank K > 0 of a torchrun job, or `--nnodes`' own torchrun: rank 0's `cascade run` says the rest."""
    if result.nodes is not None:
        notice(f"this node's ranks of the {result.nodes}-node job ended (exit {result.exit_code}); the "
               "node of rank 0 printed the run")  # fmt: skip
        return
    run = f"run {result.run_id[:8]}" if result.run_id else "its run"
    notice(f"rank {result.rank}: the script ended (exit {result.exit_code}); rank 0's cascade run "
           f"records it in {run}")  # fmt: skip
    for warning in result.warnings:
        notice(f"warning: {warning}")


def run_result(result: RunResult) -> None:
    """`cascade run`: how the run ended, its warnings, what is still pending, where to see it."""
    if result.rank is not None or result.nodes is not None:
        _part_of_a_job(result)
        return
    if result.discarded:
        notice(f"not kept: the script stopped in argument parsing (exit {result.exit_code}) before its "
               f"first step; run {result.run_id[:8]} deleted from the store")  # fmt: skip
        for warning in result.warnings:
            notice(f"warning: {warning}")
        return
    duration = result.manifest.outcome.get("duration_s")
    ours = result.manifest.metrics.get("keys", {})
    metrics = {k: v["last"] for k, v in ours.items() if not k.startswith("cascade.")}
    metrics.update(sorted(result.logged.items()))  # (after cascade's own: what a framework's logger wrote)
    shown = ", ".join(f"{k}={_num(v)}" for k, v in list(metrics.items())[:4])
    notice(
        f"run {result.run_id} {result.status} in {duration:.1f}s (exit {result.exit_code})"
        + (" · record incomplete" if result.incomplete else "")
        + (f" · {shown}" if shown else "")
    )
    if result.version:
        notice(f"tagged run {result.run_id[:8]} as {result.version}")
    for warning in result.warnings:
        notice(f"warning: {warning}")
    if result.incomplete:
        notice("the record is incomplete; the store lacks:")
        for line in result.incomplete:
            notice(f"  {line}")
        if result.spool:
            notice(f"kept in {result.spool}: `cascade sync` delivers it when the store answers (exit 4)")
    uri = redact_text(result.tracking_uri)
    if is_tracking_server(uri):  # its own UI shows the run
        where = f"{uri} (experiment {result.experiment})"
    else:
        import shlex  # (a path with spaces: the command is pasted into a shell)

        where = f"mlflow ui --backend-store-uri {shlex.quote(uri)}"
    notice(f"see it: cascade show {result.run_id[:8]}  ·  {where}")


def misplaced_options(options: list[str], command: str) -> None:
    """`cascade run train.py --seed 7`: cascade's options after the script went to the script."""
    named = f"{options[0]} is an option" if len(options) == 1 else f"{', '.join(options)} are options"
    notice(f"{named} of `cascade run`: after the script, arguments go to the script. Put them before it:")
    notice(f"  {command}")


def sync_result(delivered: list[Delivered]) -> None:
    """`cascade sync` / `cascade recover`: one line per spooled run (progress went by as notices)."""
    if not delivered:
        notice("nothing pending: every run's record is in the store")
        return
    for item in delivered:
        run = item.run_id[:12] if item.run_id else "(not opened)"
        notice(f"{run} {item.status}: {item.points} metric points stored")
        for line in item.missing:
            notice(f"  missing: {line}")


def run_list(runs: list[RunSummary], show_experiment: bool = False, versions_only: bool = False,
             filtered: bool = False) -> None:  # fmt: skip
    """`cascade ls`: one row per run, newest first (pending and stale ones marked)."""
    from rich.table import Table

    console = _console()
    if not runs:
        if filtered:
            console.print("no runs match (`cascade ls` without --user/--running lists them all)")
        elif versions_only:
            console.print("no versions yet: `cascade run --tag v1 train.py` or `cascade tag RUN v1`")
        elif show_experiment:
            console.print("no runs yet: record one with `cascade run train.py`")
        else:  # the experiment is named in cascade.yaml, else after the git remote or the directory
            console.print("no runs yet in this project's experiment: record one with `cascade run train.py`;"
                          " runs of every experiment: `cascade ls --all`")  # fmt: skip
        return
    cells: dict[str, list[str]] = {"experiment": [r.experiment for r in runs]} if show_experiment else {}
    cells.update({
        "run": [r.run_id or "(spooled)" for r in runs],
        "name": [r.name or "" for r in runs],
        "version": [r.version or "" for r in runs],
        "status": [_status(r) for r in runs],
        "user": [r.user or "" for r in runs],
        "start": [_time(r.start_time) for r in runs],
        "duration": [f"{r.duration_s:.1f}s" if r.duration_s is not None else "" for r in runs],
        "commit": [(r.commit or "")[:10] + ("+dirty" if r.dirty else "") for r in runs],
        "metrics": ["  ".join(f"{k}={_num(v)}" for k, v in r.metrics.items()) for r in runs],
    })  # fmt: skip
    cells = {column: [one_line(value) for value in values] for column, values in cells.items()}  # a row each
    layout = fit_columns(cells, console.width)
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, width in layout.widths.items():
        table.add_column(name, no_wrap=True, overflow="ellipsis", min_width=width if name == "run" else None,
                         max_width=width)  # fmt: skip
    for index in range(len(runs)):
        table.add_row(*(_cut(cells[name][index], name, width) for name, width in layout.widths.items()))
    console.print(table)
    if layout.dropped:
        console.print(f"({', '.join(layout.dropped)} not shown at this width: a wider terminal, or --json)")


# `cascade ls` on a narrow terminal: what gives way, in order, before the run id goes below the 8
# characters people type (`cascade run` prints `cascade show 1a2b3c4d`). Each step is (column, width):
# a width shrinks that column to it, 0 drops it.
ID_WIDTHS = (32, 12, 8)
_GIVE_WAY = (("metrics", 24), ("run", 12), ("metrics", 0), ("user", 0), ("commit", 0), ("experiment", 16),
             ("run", 8), ("start", 11), ("name", 16), ("version", 10), ("status", 9), ("name", 10),
             ("experiment", 8))  # fmt: skip
_GAP = 2  # between two columns (rich's padding of one on each side)


@dataclass(frozen=True)
class ListLayout:
    """The columns `cascade ls` shows at a width, each with its width, and those it left out."""

    widths: dict[str, int]
    dropped: tuple[str, ...]


def fit_columns(cells: dict[str, list[str]], width: int) -> ListLayout:
    """Which of `cells`' columns fit in `width` characters, and how wide: columns nothing fills are
    left out, and the rest give way in `_GIVE_WAY`'s order; the run id never gets under 8 characters."""
    widths = {name: max(len(name), *(len(value) for value in values)) for name, values in cells.items()
              if name == "run" or any(values)}  # fmt: skip
    widths["run"] = min(widths["run"], ID_WIDTHS[0])
    dropped: list[str] = []

    def total() -> int:
        return sum(widths.values()) + _GAP * (len(widths) - 1)

    for name, size in _GIVE_WAY:
        if total() <= width:
            break
        if name not in widths:
            continue
        if size == 0:
            del widths[name]
            dropped.append(name)
        else:
            widths[name] = min(widths[name], max(size, len(name)) if name != "run" else size)
    return ListLayout(widths, tuple(dropped))


def _cut(value: str, column: str, width: int) -> str:
    """A cell cut to its column: a run id plainly (the part shown is what one types), the start time
    to month and day, anything else with an ellipsis (by rich)."""
    if column == "run" and value != "(spooled)":
        return value[:width]
    if column == "start" and len(value) > width:
        return value[5:]  # 2026-12-05 20:47 → 12-05 20:47
    return value


def _status(run: RunSummary) -> str:
    """RUNNING, or STALE with how long its process has been silent."""
    if not run.stale:
        return run.status
    since = run.heartbeat or run.start_time
    silent = f" {_duration(time.time() - since)}" if since else ""
    return f"STALE (no heartbeat{silent})"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def run_record(record: RunRecord) -> None:
    """`cascade show`: the record of one run, section by section."""
    from rich.table import Table

    m = record.manifest
    console = _console()
    outcome = m.outcome
    name, version = (one_line(str(v)) if v else v for v in (record.tags.get("mlflow.runName"),
                                                             record.tags.get("cascade.version")))  # fmt: skip
    experiment = one_line(m.experiment)
    console.print(_styled((f"run {m.run_id}", "bold"), f"  {record.status}  experiment {experiment}",
                          f"  name {name}" if name else "", *((("  version ", ""), (version, "bold"))
                                                              if version else ())))  # fmt: skip
    recovered = str(outcome.get("recovered") or "")
    error = outcome.get("error")
    if isinstance(error, dict) and recovered and error.get("message") == recovered:  # (said once, below)
        error = {"type": error.get("type")}
    # the parent died before it captured the repository and the machine: none of it was looked at
    uncaptured = "not captured (the cascade process died first)" \
        if any(item.startswith("capture:") for item in outcome.missing) else None  # fmt: skip
    rows: list[tuple[str, str]] = [
        ("command", _command(m.command)),
        ("cwd", m.command.get("cwd", "")),
        ("outcome", "still running: its outcome, trace and files are recorded when it ends"
         if record.status == "RUNNING" and outcome.exit_code is None
         else f"{_exit(outcome.exit_code, recovered, outcome.signal)} after {outcome.get('duration_s')}s"),
        ("error", error_line(error)),
        ("recovered", recovered),
        ("missing", "; ".join(outcome.missing)),
        ("not stored", "; ".join(map(str, outcome.get("undelivered") or []))),
        ("commit", uncaptured or f"{m.git.commit} ({m.git.branch or 'detached'})"),
        ("dirty", uncaptured or _dirty(m.git)),
        ("inputs", _files(m.inputs, "not tracked by git or DVC", outcome.get("inputs_not_recorded"))),
        ("read outside", _outside(*outcome.read_outside)),
        ("outputs", _files(m.outputs, "written by the run")),
        ("remotes", ", ".join(f"{k} {v}" for k, v in m.git.get("remotes", {}).items())),
        ("seed", _seed(m)),
        ("params", f"{m.params.get('source') or '(none)'}" + _overrides(m.params.get("overrides") or {})),
        ("determinism", f"{m.determinism.get('mode')}"),
        ("python", uncaptured or f"{m.python.version} · {len(m.python.packages)} packages"),
        ("torch", _torch(m.torch)),
        ("cpu", uncaptured or f"{m.hardware.cpu_model} · {m.hardware.cpu_count} cores"),
        ("gpus", _gpus(m.gpus or m.hardware.get("gpus"))),  # "unavailable: ..." says why there are none
        ("os", uncaptured or _os(m.hardware.get("os") or {})),
        ("container", _container(m.container)),
        ("env vars", uncaptured or f"{len(m.environment)} recorded"),
        ("artifacts", record.artifact_uri),
    ]
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        if value:  # (the record's text: a script's colours in its error message are dropped too)
            table.add_row(key, one_line(value))
    console.print(table)
    from cascade_repro.params import flatten

    flat = flatten(m.params.get("values", {}))
    if flat:
        params = Table(title="params", box=None, header_style="bold", title_justify="left")
        params.add_column("key")
        params.add_column("value")
        for key, value in flat.items():
            shown = json.dumps(value) if not isinstance(value, str) else value
            params.add_row(one_line(key), one_line(shown))
        console.print(params)
    if record.trace is not None:
        _trace_summary(console, record.trace, record.status == "RUNNING")
    elif m.trace:
        console.print(f"trace: {_trace_count(m.trace)} ({_trace_more(m.trace, record.status)})")
    _metrics(console, m.metrics.get("keys") or {}, record.metrics)


def _metrics(console: Any, summary: dict[str, Any], last: dict[str, float]) -> None:
    """Every metric of the run, the script's before cascade's own: with cascade's summary (last, min,
    max, points) of those logged through `cascade_repro.log_metrics`, and the store's last value of
    those the script logged to MLflow itself (a framework's logger: HF's MLflowCallback, Lightning's
    MLFlowLogger), which never pass cascade's writer, so its summary has none of them."""
    from rich.table import Table

    keys = sorted({*summary, *last}, key=lambda k: (k.startswith("cascade."), k))
    if not keys:
        return
    metrics = Table(title="metrics", box=None, header_style="bold", title_justify="left")
    for column in ("key", "last", "min", "max", "points"):
        metrics.add_column(column)
    for key in keys:
        stats = summary.get(key)
        if stats:
            cells = [_num(stats[f]) if f in stats else "" for f in ("last", "min", "max")]
            metrics.add_row(one_line(key), *cells, str(stats.get("count", "")))
        elif key in last:
            metrics.add_row(one_line(key), _num(last[key]))
    console.print(metrics)
    if not set(last) <= set(summary):
        console.print("(min, max, points: only for metrics logged with cascade_repro.log_metrics)")


def checkpoints(entries: Sequence[CheckpointEntry]) -> None:
    """`cascade show --checkpoints`: each checkpoint with its step, metrics, md5 and state."""
    from rich.table import Table

    console = _console()
    if not entries:
        console.print("no checkpoints: the run wrote none with torch.save or cascade_repro.checkpoint")
        return
    table = Table(box=None, header_style="bold")
    for column in ("step", "path", "status", "metrics", "md5", "size", "pushed"):
        table.add_column(column)
    for entry in entries:
        metrics = "  ".join(f"{k}={_num(v)}" for k, v in entry.metrics.items())
        pushed = (
            {True: "yes", False: "NO"}.get(bool(entry.get("pushed")), "") if "pushed" in entry.raw else ""
        )
        table.add_row(
            "before 0" if entry.step is None else str(entry.step), one_line(entry.path),
            one_line(str(entry.status) + (f" ({entry.get('reason')})" if entry.get("reason") else "")),
            one_line(metrics), str(entry.md5 or "")[:12], _size(entry.size), pushed,
        )  # fmt: skip
    console.print(table)


def image_result(prepared: PreparedImage) -> None:
    """`cascade image build`: the image found or built, and its inputs."""
    for warning in prepared.warnings:
        notice(f"warning: {warning}")
    image = prepared.image
    how = f"built in {image.build_s:.1f} s" if image.built else "already built from the same inputs"
    print(f"{image.tag}  {image.image_id}  ({how})")


def ui_started(server: UiServer) -> None:
    """`cascade ui`: the store on stderr, the URL once, alone on stdout (scripts read that line)."""
    notice(f"MLflow UI on the store {redact_text(server.store)} (log: {server.log}; Ctrl-C stops it)")
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()


def ui_stopped(outcome: UiOutcome) -> None:
    """`cascade ui`: how it ended (stopped here, or the server exited and its log says why)."""
    if outcome.server_exit is None:
        notice("MLflow UI stopped")
    else:
        error(f"the MLflow UI exited with {outcome.server_exit}; see {outcome.log}")


def tag_result(result: TagResult) -> None:
    """`cascade tag`: the version given, the git tag made, the run it was moved from."""
    where = f" and git tag at {result.commit[:12]}" if result.git_tag else ""
    moved = f" (moved from run {result.moved_from[:12]})" if result.moved_from else ""
    text = _styled(f"tagged run {result.run_id[:12]} as ", (result.version, "bold"), f"{where}{moved}")
    _console().print(text)


def _trace_summary(console: Any, t: Any, running: bool = False) -> None:
    if t.algorithm is None:
        why = "  not stored yet: the run is still RUNNING (its trace is stored when it ends)" if running \
            else "  none: the script ran no optimizer step or backward(), or --trace-interval 0"  # fmt: skip
        console.print(_styled(("trace", "bold"), why))
        return
    _trace_steps(console, t)
    if t.grads is not None:
        hashed = "weights and gradients" if t.grads else "weights only (gradients: trace_grads)"
        console.print(f"  fingerprints of {hashed}")
    if t.cost is not None:
        _trace_cost(console, t.cost, t.budget)
    if t.steps and not t.batches:
        console.print("  no batches: the script read no torch DataLoader, whose batches the trace "
                      "fingerprints; data read another way is covered by the input files the run "
                      "recorded and by the RNG state that samples them")
    if t.loss_first is None:
        return
    parts = [f"loss first {_num(t.loss_first)}", f"last {_num(t.loss_last)}"]
    if t.loss_min:
        parts.append(f"min {_num(t.loss_min[1])} at step {t.loss_min[0]}")
    if t.loss_max:
        parts.append(f"max {_num(t.loss_max[1])} at step {t.loss_max[0]}")
    if t.nonfinite_losses:
        parts.append(f"{t.nonfinite_losses} non-finite")
    console.print("  " + ", ".join(parts))


def _trace_more(section: dict[str, Any], status: str) -> str:
    """Where to look next: the loss curve, or why a finished run has no step (`verify` would say it)."""
    if section.get("steps") == 0 and status == "FINISHED":
        from cascade_repro.determinism.verdict import NO_STEP_TRACED

        return NO_STEP_TRACED
    return "cascade show --trace for the loss curve"


def _trace_count(section: dict[str, Any]) -> str:
    """The record's count of trace lines: steps, or records where the budget thinned them."""
    count = one_line(str(section.get("steps")))
    schedule = parse_schedule(section.get("records")) or []
    thinned = ", ".join(f"every {every} from step {start}" for start, every in schedule if every > 1)
    return f"{count} records, thinned by the budget ({thinned})" if thinned else f"{count} steps"


def _trace_steps(console: Any, t: Any) -> None:
    """How many steps have a record, and which where the budget thinned them."""
    span = f", steps {t.first_step}..{t.last_step}" if t.steps else ""
    failed = list(t.unfinished)
    if failed and failed[-1] == t.last_step:
        failed.pop()
        span += f" (the run ended inside step {t.last_step}: its weights are those at exit)"
    if failed:
        shown = ", ".join(map(str, failed[:10])) + (", ..." if len(failed) > 10 else "")
        span += f"; {len(failed)} step(s) did not end, their optimizer raised and the script went on: {shown}"
    if not t.records:
        recorded = f"  {t.steps} steps recorded (every {t.interval}, {one_line(str(t.algorithm))}){span}"
        console.print(_styled(("trace", "bold"), recorded))
        return
    thinned = ", ".join(f"every {every} from step {start}" for start, every in t.records if every > 1)
    recorded = f"  {t.steps} records ({one_line(str(t.algorithm))}){span}: thinned by the budget, {thinned}"
    console.print(_styled(("trace", "bold"), recorded))
    console.print("  (the steps being short: `cascade verify` brackets a divergence between two records, "
                  "`--replay` pins its step)")


def _trace_cost(console: Any, cost: dict[str, float], budget: float | None) -> None:
    """What the trace took of the training loop, and why where the budget could not hold it."""
    within = f"; budget {budget:.1%}" if budget else ""
    console.print(f"  cost {cost['share']:.1%} of the training loop's time ({cost['every_step']:.1%} the "
                  f"facets read every step, {cost['sampled']:.1%} the weights (and gradients) at sampled "
                  f"steps{within}), steps of {cost['step_ms']:.3g} ms; once, at the first step: "
                  f"{cost['setup_ms']:.3g} ms")  # fmt: skip
    if budget and cost["every_step"] > budget:
        console.print("  the facets read at recorded steps (RNG state, batch, loss) took more than the "
                      "budget, the steps being short: the first "
                      f"{FULL_RECORDS} steps have a record each, then as rarely as the trace goes "
                      "(trace_interval: 0 in cascade.yaml, or --trace-interval 0, turns it off)")


def _os(system: dict[str, Any]) -> str:
    return f"{system.get('system')} {system.get('release')}"


def _command(command: Mapping[str, Any]) -> str:
    """The `cascade run` command as it was typed, cascade's own options too (`--seed 7`), quoted to
    be pasted; a record from before `invocation` was kept: the script and its arguments."""
    invocation = command.get("invocation")
    if isinstance(invocation, list) and invocation and all(isinstance(part, str) for part in invocation):
        return " ".join(map(_pasted, invocation))
    return " ".join(["cascade run", *map(_pasted, [str(command.get("script", "")),
                                                   *map(str, command.get("argv") or [])])])  # fmt: skip


_ANSI_C = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _pasted(part: str) -> str:
    """One argument quoted for a shell, on one line: with a control character (a prompt's newline),
    bash's $'...' quoting, where they are escapes."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in part):
        return shlex.quote(part)
    return "$'" + "".join(_ANSI_C.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c)
                          for c in part) + "'"  # fmt: skip


def _exit(code: int | None, recovered: str, signal_number: Any = None) -> str:
    if code is None:
        return "no exit code seen" + (" (the cascade process died first)" if recovered else "")
    said = f"exit {code}"
    if isinstance(signal_number, int) and not isinstance(signal_number, bool):
        ending = ", which caught it and ended itself)" if code == 0 else ")"
        said += f" ({signal_name(signal_number)} reached the script{ending}"
    return said


def _dirty(git: GitSection) -> str:
    left_out = _earlier_outputs(git)
    if not git.dirty:
        return "no" + (f" ({left_out})" if left_out else "")
    patch = git.patch or {}
    said = f"yes: patch {patch.get('size', 0)} bytes, {len(git.untracked)} untracked file(s)"
    return said + (f"; {left_out}" if left_out else "")


def _earlier_outputs(git: GitSection) -> str:
    """The untracked files left out of the dirty state as earlier runs' outputs, named (untrusted)."""
    entries = git.get("earlier_outputs")
    if not isinstance(entries, list) or not entries:
        return ""
    more = git.get("earlier_outputs_more")
    count = len(entries) + (more if type(more) is int and more > 0 else 0)
    named = [str(e.get("path"))[:80] for e in entries[:3] if isinstance(e, dict)]
    return f"{count} file(s) earlier runs wrote left out, unchanged: {', '.join(named)}" + (
        " …" if count > len(named) else "")  # fmt: skip


def _outside(paths: list[str], count: int) -> str:
    if not count:
        return ""
    more = f" and {count - len(paths)} more" if count > len(paths) else ""
    return f"{count} file(s) outside the repository, named, not recorded: {', '.join(paths[:5])}{more}"


def _files(entries: Sequence[FileEntry], what: str, not_recorded: Any = None) -> str:
    """`2 file(s) not tracked by git or DVC: data/train.bin (8.0 kB, in the DVC cache), ...`; and
    `not_recorded`, how many more inputs the run read than its record holds, said first."""
    unrecorded = not_recorded if isinstance(not_recorded, int) and not isinstance(not_recorded, bool) else 0
    if not entries and not unrecorded:
        return ""
    shown = []
    for entry in entries[:6]:
        note = f"{entry.size} bytes" if entry.size is not None else ""
        if entry.get("rewritten"):
            note += ", as read: the run rewrote it"
        if entry.md5:
            note += ", in the DVC cache"
        if entry.written_by:
            note += f", written by run {entry.written_by[:8]}"
        shown.append(f"{entry.path} ({note})" if note else entry.path)
    more = f" and {len(entries) - 6} more" if len(entries) > 6 else ""
    said = f"{len(entries)} file(s) {what}: " + ", ".join(shown) + more
    if unrecorded:
        said = (f"{len(entries) + unrecorded} file(s) {what}, {unrecorded} of them NOT recorded (the record "
                f"holds {len(entries)}; restore cannot provide the rest: `dvc add` their directory) · {said}")
    return said


def _overrides(overrides: dict[str, Any]) -> str:
    return "" if not overrides else " · overrides " + ", ".join(f"{k}={v}" for k, v in overrides.items())


def _torch(torch: TorchSection) -> str:
    if torch.version is None:  # (the script never imported torch, or the run ended first)
        return ""
    parts = [str(torch.version)]
    for key in ("cuda", "cudnn", "cpu_capability", "num_threads"):
        if torch.get(key) is not None:
            parts.append(f"{key} {torch.get(key)}")
    return " · ".join(parts)


def _container(container: ContainerSection) -> str:
    if container.get("unavailable"):
        return str(container.get("unavailable"))
    if not container.get("in_container"):
        return "no"
    image_id = container.image_id or ""
    if not container.image and not image_id:
        # started by something else (a dev container, CI, Kubernetes): a fact, not a fault
        evidence = ", ".join(map(str, container.get("evidence") or []))
        return (f"yes{f' ({evidence})' if evidence else ''}, started outside cascade; to record its image, "
                "set CASCADE_IMAGE (and CASCADE_IMAGE_ID) where it starts")  # fmt: skip
    image = container.image or "image not recorded"
    how = " · run by cascade --docker" if container.in_docker else ""
    return f"{image}" + (f" ({image_id[7:19]})" if image_id.startswith("sha256:") else "") + how


def _gpus(gpus: Any) -> str:
    if not gpus:
        return "none"
    if isinstance(gpus, str):
        return gpus
    return ", ".join(f"{g.get('name')} (cc {g.get('compute_capability')})" for g in gpus)


def _seed(record: Manifest) -> str:
    """cascade's seed, and beside it the seeds the script set itself (and whether they took over)."""
    from cascade_repro.determinism import script_seeds

    source = record.params.get("seed_source")
    shown = f"{record.seed} ({source})" if source else str(record.seed)
    if record.seed is None:
        shown = "not recorded"
    calls = script_seeds.described(record.determinism)
    if not calls:
        return shown
    shown += "; the script set " + ", ".join(calls[:6]) + (" …" if len(calls) > 6 else "")
    taken = script_seeds.overridden(record.determinism)
    if taken:
        shown += f"; cascade's seed had no effect on {script_seeds.words(taken)}"
    return shown
