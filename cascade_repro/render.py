"""Everything cascade prints: rich tables for people, a versioned JSON envelope for machines."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import sys
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Mapping, cast

from cascade_repro.redaction import fill_argv, redact_text

if TYPE_CHECKING:
    from cascade_repro.api.browsing import RunSummary
    from cascade_repro.api.data import CheckoutResult
    from cascade_repro.api.records import RunRecord
    from cascade_repro.api.restoring import RestoreResult
    from cascade_repro.check import CheckReport
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.diff import Diff
    from cascade_repro.images.prepare import PreparedImage
    from cascade_repro.project import InitResult
    from cascade_repro.recovery import Delivered
    from cascade_repro.restore import RestorePlan
    from cascade_repro.run_plan import RunResult
    from cascade_repro.store.ui_server import UiOutcome, UiServer
    from cascade_repro.versions import TagResult

JSON_SCHEMA = "cascade.cli/1"


# Run records may come from a shared server: text from them reaches the terminal without its control
# characters (an escape sequence could retitle the window, write the clipboard or hide a line), and
# rich's markup is off, so brackets in a name or a param are printed, not interpreted.
_CONTROL = re.compile(r"\x1b\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def printable(text: str) -> str:
    """`text` without terminal control characters (newlines and tabs stay)."""
    return _CONTROL.sub("", text)


class _Printable:
    """A stream for rich: its own colour sequences pass, any other control character is dropped."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        kept = []
        position = 0
        for match in _SGR.finditer(text):
            kept += [printable(text[position : match.start()]), match.group()]
            position = match.end()
        kept.append(printable(text[position:]))
        self._stream.write("".join(kept))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def notice(message: str) -> None:
    """A one-line status message on stderr (plain: used while the script's output streams)."""
    sys.stderr.write(f"cascade: {printable(message)}\n")
    sys.stderr.flush()


def error(message: str) -> None:
    sys.stderr.write(f"cascade: error: {printable(message)}\n")
    sys.stderr.flush()


def emit_json(command: str, data: Any) -> None:
    envelope = {"schema": JSON_SCHEMA, "command": command, "data": data}
    sys.stdout.write(json.dumps(envelope, indent=2, sort_keys=True, default=str) + "\n")


def _console() -> Any:
    from rich.console import Console

    # Piped output is for grep and less: do not squeeze tables into 80 columns.
    width = None if sys.stdout.isatty() else 220
    stream = cast(IO[str], _Printable(sys.stdout))
    return Console(highlight=False, soft_wrap=False, width=width, markup=False, file=stream)


def _styled(*parts: str | tuple[str, str]) -> Any:
    """Text with some parts styled: ("run abc", "bold"), plain strings as they are (never markup)."""
    from rich.text import Text

    return Text.assemble(*parts)


def init_result(result: InitResult) -> None:
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
    console.print("next: commit these files, then `cascade run train.py`")


def run_result(result: RunResult) -> None:
    if result.rank is not None:  # rank K > 0 of the user's torchrun job: rank 0's run says the rest
        run = f"run {result.run_id[:8]}" if result.run_id else "its run"
        notice(f"rank {result.rank}: the script ended (exit {result.exit_code}); rank 0's cascade run "
               f"records it in {run}")  # fmt: skip
        return
    if result.discarded:
        notice(f"not kept: the script stopped in argument parsing (exit {result.exit_code}) before its "
               f"first step; run {result.run_id[:8]} deleted from the store")  # fmt: skip
        for warning in result.warnings:
            notice(f"warning: {warning}")
        return
    outcome = result.manifest.outcome or {}
    duration = outcome.get("duration_s")
    metrics = {
        k: v for k, v in result.manifest.metrics.get("keys", {}).items() if not k.startswith("cascade.")
    }
    shown = ", ".join(f"{k}={_num(v['last'])}" for k, v in list(metrics.items())[:4])
    notice(
        f"run {result.run_id} {result.status} in {duration:.1f}s (exit {result.exit_code})"
        + (" · record incomplete" if result.incomplete else "")
        + (f" · {shown}" if shown else "")
    )
    for warning in result.warnings:
        notice(f"warning: {warning}")
    if result.incomplete:
        notice("the record is incomplete; the store lacks:")
        for line in result.incomplete:
            notice(f"  {line}")
        if result.spool:
            notice(f"kept in {result.spool}: `cascade sync` delivers it when the store answers (exit 4)")
    notice(
        f"see it: cascade show {result.run_id[:8]}  ·  mlflow ui --backend-store-uri {result.tracking_uri}"
    )


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


def run_list(runs: list[RunSummary], show_experiment: bool = False, versions_only: bool = False) -> None:
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    columns = ("run", "name", "version", "status", "start", "duration", "commit", "metrics")
    for column in ("experiment", *columns) if show_experiment else columns:
        table.add_column(column)
    for run in runs:
        commit = (run.commit or "")[:10] + ("+dirty" if run.dirty else "")
        table.add_row(
            *((run.experiment,) if show_experiment else ()),
            run.run_id[:12] or "(spooled)",
            run.name or "",
            run.version or "",
            run.status,
            _time(run.start_time),
            f"{run.duration_s:.1f}s" if run.duration_s is not None else "",
            commit,
            "  ".join(f"{k}={_num(v)}" for k, v in run.metrics.items()),
        )
    console = _console()
    if not runs:
        if versions_only:
            console.print("no versions yet: `cascade run --tag v1 train.py` or `cascade tag RUN v1`")
        else:
            console.print("no runs yet: record one with `cascade run train.py`")
        return
    console.print(table)


def run_record(record: RunRecord) -> None:
    from rich.table import Table

    m = record.manifest
    console = _console()
    outcome = m.outcome or {}
    console.print(_styled((f"run {m.run_id}", "bold"), f"  {record.status}  experiment {m.experiment}"))
    rows: list[tuple[str, str]] = [
        ("command", " ".join(["cascade run", m.command.get("script", ""), *m.command.get("argv", [])])),
        ("cwd", m.command.get("cwd", "")),
        ("outcome", f"exit {outcome.get('exit_code')} after {outcome.get('duration_s')}s"),
        ("error", _error(outcome.get("error"))),
        ("recovered", str(outcome.get("recovered") or "")),
        ("missing", "; ".join(map(str, outcome.get("missing") or []))),
        ("not stored", "; ".join(map(str, outcome.get("undelivered") or []))),
        ("commit", f"{m.git.get('commit')} ({m.git.get('branch') or 'detached'})"),
        ("dirty", _dirty(m.git)),
        ("inputs", _files(m.inputs, "not tracked by git or DVC")),
        ("outputs", _files(m.outputs, "written by the run")),
        ("remotes", ", ".join(f"{k} {v}" for k, v in m.git.get("remotes", {}).items())),
        ("seed", _seed(m.to_dict())),
        ("params", f"{m.params.get('source') or '(none)'}" + _overrides(m.params.get("overrides") or {})),
        ("determinism", f"{m.determinism.get('mode')}"),
        ("python", f"{m.python.get('version')} · {len(m.python.get('packages', {}))} packages"),
        ("torch", _torch(m.torch)),
        ("cpu", f"{m.hardware.get('cpu', {}).get('model')} · {m.hardware.get('cpu', {}).get('count')} cores"),
        ("gpus", _gpus(m.torch.get("gpus") or m.hardware.get("gpus"))),
        ("os", f"{m.hardware.get('os', {}).get('system')} {m.hardware.get('os', {}).get('release')}"),
        ("container", _container(m.container)),
        ("env vars", f"{len(m.environment)} recorded"),
        ("artifacts", record.artifact_uri),
    ]
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        if value:
            table.add_row(key, value)
    console.print(table)
    from cascade_repro.params import flatten

    flat = flatten(m.params.get("values", {}))
    if flat:
        params = Table(title="params", box=None, header_style="bold", title_justify="left")
        params.add_column("key")
        params.add_column("value")
        for key, value in flat.items():
            params.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
        console.print(params)
    if record.trace is not None:
        _trace_summary(console, record.trace)
    elif m.trace:
        console.print(f"trace: {m.trace.get('steps')} steps (cascade show --trace for the loss curve)")
    summary = m.metrics.get("keys", {})
    if summary:
        metrics = Table(title="metrics", box=None, header_style="bold", title_justify="left")
        for column in ("key", "last", "min", "max", "points"):
            metrics.add_column(column)
        for key, stats in summary.items():
            metrics.add_row(
                key, _num(stats["last"]), _num(stats["min"]), _num(stats["max"]), str(stats["count"])
            )
        console.print(metrics)


def verdict(result: Verdict) -> None:
    """`cascade verify`: the verdict, each rank's, the first divergence, the likely causes."""
    console = _console()
    style = "green" if result.reproduced else "red"
    console.print(_styled((result.verdict, f"bold {style}"), f"  {result.run_a[:12]} → {result.run_b[:12]}"))
    console.print(f"  {result.summary}")
    for rank in result.ranks:
        console.print(f"  rank {rank.rank}: {rank.verdict} ({rank.steps} steps compared)")
    c = result.comparison
    if c.step is not None:
        for difference in c.differences:
            names = f" {', '.join(difference.names[:6])}" if difference.names else ""
            console.print(f"  step {c.step} · {difference.facet}:{names} ({difference.detail})")
        for magnitude in result.magnitudes:
            console.print(f"  step {c.step} · {magnitude.facet} {magnitude.name}: {magnitude.detail}")
    _replay(console, result.replay)
    if result.causes:
        console.print("  Likely causes, most likely first:")
        for index, cause in enumerate(result.causes, 1):
            console.print(f"    {index}. {cause.summary}")
            console.print(f"       evidence: {cause.evidence}")
            console.print(f"       fix: {cause.fix}")
    for record_difference in result.differences:
        if not any(record_difference.summary == cause.summary for cause in result.causes):
            console.print(f"  also differs (class {record_difference.klass}): {record_difference.summary}")
    for note in c.notes:
        console.print(f"  note: {note}")


def _replay(console: Any, replay: Mapping[str, Any] | None) -> None:
    """`verify --replay`: the runs it made, and what it could not measure."""
    if replay is None:
        return
    runs = replay.get("runs") or {}
    if runs:
        console.print("  replayed as runs " + ", ".join(f"{side}: {run[:12]}" for side, run in runs.items()))
    for reason in replay.get("not_measured") or []:
        console.print(f"  not measured: {reason}")


def checkpoints(entries: list[dict[str, Any]]) -> None:
    from rich.table import Table

    console = _console()
    if not entries:
        console.print("no checkpoints: the run wrote none with torch.save or cascade_repro.checkpoint")
        return
    table = Table(box=None, header_style="bold")
    for column in ("step", "path", "status", "metrics", "md5", "size", "pushed"):
        table.add_column(column)
    for entry in entries:
        metrics = "  ".join(f"{k}={_num(v)}" for k, v in (entry.get("metrics") or {}).items())
        pushed = {True: "yes", False: "NO"}.get(bool(entry["pushed"]), "") if "pushed" in entry else ""
        table.add_row(
            "" if entry.get("step") is None else str(entry["step"]), str(entry.get("path")),
            str(entry.get("status")) + (f" ({entry['reason']})" if entry.get("reason") else ""),
            metrics, str(entry.get("md5") or "")[:12], _size(entry.get("size")), pushed,
        )  # fmt: skip
    console.print(table)


@contextlib.contextmanager
def byte_progress() -> Iterator[Callable[[str, int | None], Callable[[int], None] | None]]:
    """A progress-bar factory for long hashing and copying: bars on a terminal, nothing elsewhere."""
    if not sys.stderr.isatty():
        yield lambda label, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True), transient=True,
    ) as bars:  # fmt: skip

        def factory(label: str, total: int | None) -> Callable[[int], None]:
            task = bars.add_task(label, total=total or None)
            return lambda advance: bars.advance(task, advance)

        yield factory


def image_result(prepared: PreparedImage) -> None:
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


def checkout_result(result: CheckoutResult) -> None:
    if result.chosen is not None:
        entry = result.chosen.entry
        step = f"step {entry['step']}; " if entry.get("step") is not None else ""
        notice(f"took {entry.get('path')} ({step}{result.chosen.why})")
    for item in result.items:
        notice(f"{item.path} → {item.written_to} (md5 {item.md5[:12]} verified, from the {item.source})")


def _size(size: Any) -> str:
    if not isinstance(size, (int, float)):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


CLASS_WORDS = {"A": "class A · bitwise impossible", "B": "class B · likely cause", "C": "class C · info",
               "R": "results"}  # fmt: skip


def diff(result: Diff) -> None:
    from rich.table import Table

    console = _console()
    console.print(_styled((result.run_a[:12], "bold"), " → ", (result.run_b[:12], "bold")))
    for note in result.notes:
        console.print(f"  note: {note}")
    if result.identical:
        console.print("  no differences")
    for section in result.sections:
        if not section.changes:
            continue
        console.print(
            _styled("\n", (section.name, "bold"), f" ({CLASS_WORDS[section.klass]}; {section.equal} equal)")
        )
        table = Table(box=None, header_style="bold", show_header=True, pad_edge=False)
        for column in ("", "key", "A", "B", "note"):
            table.add_column(column, overflow="fold")
        for change in section.changes:
            table.add_row(change.klass, change.key, _cell(change.a), _cell(change.b), change.note or "")
        console.print(table)
    same = [s.name for s in result.sections if not s.changes and s.equal]
    if same:
        console.print(f"\nequal: {', '.join(same)}")


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def check_report(report: CheckReport) -> None:
    console = _console()
    style = {"BITWISE_REPRODUCIBLE": "green", "OK": "green", "WITHIN_TOLERANCE_ONLY": "yellow"}.get(
        report.verdict, "red"
    )
    console.print(_styled((report.verdict, f"bold {style}"), f"  ({report.subject})"))
    marks = {"ok": "ok  ", "problem": "FAIL", "not_runnable": "STOP", "tolerance": "A   ",
             "restore_fixes": "B   "}  # fmt: skip
    for finding in report.findings:
        console.print(f"  {marks.get(finding.level, '    ')} {finding.summary}")
        if finding.fix:
            console.print(f"       fix: {finding.fix}")


def tag_result(result: TagResult) -> None:
    where = f" and git tag at {result.commit[:12]}" if result.git_tag else ""
    moved = f" (moved from run {result.moved_from[:12]})" if result.moved_from else ""
    text = _styled(f"tagged run {result.run_id[:12]} as ", (result.version, "bold"), f"{where}{moved}")
    _console().print(text)


def restore_plan(plan: RestorePlan) -> None:
    """Printed before anything heavy happens (stderr: stdout stays for the verdict)."""
    what = f"{plan.version} (run {plan.run_id[:12]})" if plan.version else f"run {plan.run_id[:12]}"
    notice(f"restore plan for {what}, experiment {plan.experiment}")
    patch = plan.patch
    notice(
        f"  code       commit {plan.commit[:12]}"
        + (f" + patch of {patch.get('size')} bytes" if patch else "")
    )
    if plan.untracked:
        names = ", ".join(str(u["path"]) for u in plan.untracked[:5])
        notice(f"  untracked  {len(plan.untracked)} file(s), sha256-checked: {names}")
    notice(f"  data       {len(plan.data)} DVC object(s); checkpoints {len(plan.checkpoints)}")
    for line in _plan_inputs(plan.input_sources):
        notice(f"  inputs     {line}")
    command = " ".join((plan.script, *plan.argv))
    notice(f"  command    {command} (cwd {plan.cwd}), seed {plan.seed}, determinism {plan.determinism}"
           + (f", first {plan.steps} steps" if plan.steps else ""))  # fmt: skip
    if plan.num_threads:
        notice(f"  threads    torch.set_num_threads({plan.num_threads}), as recorded")
    for name, value in plan.environment.items():
        notice(f"  env        {name}={value}" if value is not None else f"  env        unset {name}")
    for slot in plan.secret_args:
        state = "NOT SET: set it to re-run" if slot.variable in plan.secrets_missing else "set"
        notice(f"  secret     {slot.option}: redacted in the record, taken from ${slot.variable} ({state})")
    for name, here in plan.secret_env.items():
        state = "" if here else " (not set here: the re-run goes without it)"
        notice(f"  secret     {name}: redacted in the record, this machine's value{state}")
    for difference in plan.differences:
        meaning = "bitwise not expected here" if difference.klass == "A" else "fixed by restore"
        notice(f"  machine    class {difference.klass}: {difference.summary} ({meaning})")
    notice(f"  worktree   {plan.workdir}")


def _plan_inputs(sources: Mapping[str, str]) -> list[str]:
    """Where the files the run read that neither git nor DVC tracked come from, one line per source."""
    by: dict[str, list[str]] = {}
    for path, source in sources.items():
        by.setdefault(source, []).append(path)
    words = {
        "checkout": "neither git nor DVC tracks, taken from your checkout (sha256-verified)",
        "dvc": "kept with --track-inputs, from the DVC cache (md5-verified)",
        "missing": "NOT in your checkout",
        "changed": "CHANGED in your checkout since the run",
    }
    return [
        f"{len(paths)} file(s) {words.get(source, source)}: " + ", ".join(paths[:5])
        + (" ..." if len(paths) > 5 else "")
        for source, paths in by.items()
    ]  # fmt: skip


def restore_result(result: RestoreResult) -> None:
    tree = result.worktree
    if result.run is None:
        notice(f"restored into {tree.path}" + (" (reused)" if tree.reused else ""))
        shell = {slot.variable: f"${{{slot.variable}}}" for slot in result.plan.secret_args}
        argv, _ = fill_argv(result.plan.argv, shell)  # redacted values from the variables the plan named
        command = " ".join(("cascade", "run", "--seed", str(result.plan.seed), "--deterministic",
                            result.plan.determinism, result.plan.script, *argv))  # fmt: skip
        notice(f"run it: cd {tree.path / result.plan.cwd} && {command}")
        return
    run_result(result.run)
    if result.verdict is not None:
        verdict(result.verdict)


def restore_dict(result: RestoreResult) -> dict[str, Any]:
    run = result.run
    return {
        "plan": result.plan.to_dict(),
        "worktree": {
            "path": str(result.worktree.path),
            "reused": result.worktree.reused,
            "restored_files": list(result.worktree.restored_files),
        },  # fmt: skip
        "run": None
        if run is None
        else {"run_id": run.run_id, "status": run.status, "exit_code": run.exit_code},
        "verdict": None if result.verdict is None else result.verdict.to_dict(),
        "image": None
        if result.image is None
        else {
            **result.image.record(),
            "source": "recorded" if result.image.reused_by_id else "rebuilt",
            "drift": [c.to_dict() for c in result.drift],
        },
    }


def _trace_summary(console: Any, t: Any) -> None:
    if t.algorithm is None:
        console.print(
            _styled(
                ("trace", "bold"),
                "  none: the script ran no optimizer step or backward(), or --trace-interval 0",
            )
        )
        return
    span = f", steps {t.first_step}..{t.last_step}" if t.steps else ""
    recorded = f"  {t.steps} steps recorded (every {t.interval}, {t.algorithm}){span}"
    console.print(_styled(("trace", "bold"), recorded))
    if t.grads is not None:
        hashed = "weights and gradients" if t.grads else "weights only (gradients: trace_grads)"
        console.print(f"  fingerprints of {hashed}")
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


def _num(value: float) -> str:
    return f"{value:.4g}"


def _time(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else ""


def _dirty(git: dict[str, Any]) -> str:
    if not git.get("dirty"):
        return "no"
    patch = git.get("patch") or {}
    untracked = git.get("untracked") or []
    return f"yes: patch {patch.get('size', 0)} bytes, {len(untracked)} untracked file(s)"


def _files(entries: list[dict[str, Any]], what: str) -> str:
    """`2 file(s) not tracked by git or DVC: data/train.bin (8.0 kB, in the DVC cache), ...`."""
    if not entries:
        return ""
    shown = []
    for entry in entries[:6]:
        size = entry.get("size")
        note = f"{size} bytes" if isinstance(size, int) else ""
        if entry.get("md5"):
            note += ", in the DVC cache"
        shown.append(f"{entry.get('path')} ({note})" if note else str(entry.get("path")))
    more = f" and {len(entries) - 6} more" if len(entries) > 6 else ""
    return f"{len(entries)} file(s) {what}: " + ", ".join(shown) + more


def _overrides(overrides: dict[str, Any]) -> str:
    return "" if not overrides else " · overrides " + ", ".join(f"{k}={v}" for k, v in overrides.items())


def _torch(torch: dict[str, Any]) -> str:
    parts = [str(torch.get("version"))]
    for key in ("cuda", "cudnn", "cpu_capability", "num_threads"):
        if torch.get(key) is not None:
            parts.append(f"{key} {torch[key]}")
    return " · ".join(parts)


def _container(container: dict[str, Any]) -> str:
    if container.get("unavailable"):
        return str(container["unavailable"])
    if not container.get("in_container"):
        return "no"
    image_id = str(container.get("image_id") or "")
    if not container.get("image") and not image_id:
        # started by something else (a dev container, CI, Kubernetes): a fact, not a fault
        evidence = ", ".join(map(str, container.get("evidence") or []))
        return (f"yes{f' ({evidence})' if evidence else ''}, started outside cascade; to record its image, "
                "set CASCADE_IMAGE (and CASCADE_IMAGE_ID) where it starts")  # fmt: skip
    image = container.get("image") or "image not recorded"
    how = " · run by cascade --docker" if container.get("runtime") == "docker" else ""
    return f"{image}" + (f" ({image_id[7:19]})" if image_id.startswith("sha256:") else "") + how


def _gpus(gpus: Any) -> str:
    if not gpus:
        return "none"
    if isinstance(gpus, str):
        return gpus
    return ", ".join(f"{g.get('name')} (cc {g.get('compute_capability')})" for g in gpus)


def _error(error: dict[str, Any] | None) -> str:
    return f"{error['type']}: {error['message']}" if error else ""


def _seed(record: dict[str, Any]) -> str:
    """cascade's seed, and beside it the seeds the script set itself (and whether they took over)."""
    from cascade_repro.determinism import script_seeds

    params = record.get("params") or {}
    shown = f"{params.get('seed')} ({params.get('seed_source')})"
    calls = script_seeds.described(record)
    if not calls:
        return shown
    shown += "; the script set " + ", ".join(calls[:6]) + (" …" if len(calls) > 6 else "")
    taken = script_seeds.overridden(record)
    if taken:
        shown += f"; cascade's seed had no effect on {script_seeds.words(taken)}"
    return shown
