"""More hostile run records: fields that commands act on, as a shared server could alter them.

Each test edits a real run's record (its `cascade/run.json` in the embedded store), as someone with
write access to the store would, and drives the real CLI: a malformed record is refused whole, with
"the run record is malformed" naming the field and exit 1 (CONVENTIONS: an error), before anything
is written, by every command that reads it, never with a traceback or "run with -v".
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.plugin import CASCADE, Project, git

pytestmark = pytest.mark.slow

# Every command that reads one record: what each must refuse the same way.
READERS = (
    ("show", "v1"),
    ("show", "v1", "--json"),
    ("diff", "v1", "current"),
    ("verify", "v1", "v1"),
    ("check", "v1"),
    ("restore", "v1", "--no-run"),
)


@dataclass
class Recorded:
    project: Project
    run_id: str
    record_file: Path
    record: dict[str, Any]

    def edited(self) -> dict[str, Any]:
        """A deep copy of the record as cascade wrote it, to alter."""
        return json.loads(json.dumps(self.record))

    def store(self, record: dict[str, Any] | str | bytes) -> None:
        if isinstance(record, bytes):
            self.record_file.write_bytes(record)
        else:
            self.record_file.write_text(record if isinstance(record, str) else json.dumps(record))

    @property
    def restore_dir(self) -> Path:
        return self.project.root / ".cascade" / "restore" / "v1"


@pytest.fixture
def recorded(project: Project) -> Recorded:
    """One real run of train.py, tagged v1, its record editable."""
    run_id = project.record("--tag", "v1", "train.py")
    artifacts = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade"
    record_file = artifacts / "run.json"
    return Recorded(project, run_id, record_file, json.loads(record_file.read_text()))


def _assert_refused(recorded: Recorded, named: str, readers: tuple[tuple[str, ...], ...] = READERS) -> None:
    """Every reader refuses the stored record as malformed, naming `named`, with nothing written."""
    for args in readers:
        result = recorded.project.cascade(*args)
        said = result.stderr
        assert result.returncode == 1, (args, named, result.returncode, said)
        assert "the run record is malformed" in said and named in said, (args, said)
        assert recorded.run_id in said, (args, said)
        assert "Traceback" not in said and "run with -v" not in said, (args, said)
        assert "pip install" not in result.stdout, (args, result.stdout)
        assert not recorded.restore_dir.exists(), (args, "restore wrote the worktree")
        assert len(git(recorded.project.root, "worktree", "list").splitlines()) == 1, args


# -- C: git.commit ---------------------------------------------------------------------------------


def test_a_git_commit_that_is_not_a_sha_is_refused_as_malformed(recorded: Recorded) -> None:
    commit = recorded.record["git"]["commit"]
    for bad in ("--output=/tmp/x", commit.upper(), commit[:39], commit + "0", "", "g" * 40):
        record = recorded.edited()
        record["git"]["commit"] = bad
        recorded.store(record)
        _assert_refused(recorded, "git.commit", READERS if bad == "--output=/tmp/x" else (("show", "v1"),))
    for good in (commit, "0123456789abcdef" * 4):  # a SHA-1 commit, and a SHA-256 repository's
        record = recorded.edited()
        record["git"]["commit"] = good
        recorded.store(record)
        result = recorded.project.cascade("show", "v1")
        assert result.returncode == 0 and good in result.stdout, result.stderr


# -- A: nesting depth ------------------------------------------------------------------------------


def _nested(recorded: Recorded, levels: int, where: str) -> str:
    """The record's text with `levels` nested objects at `where` (written as text: the JSON encoder
    itself would overflow the stack building it)."""
    record = recorded.edited()
    section, key = where.split(".")
    record[section][key] = "@DEEP@"
    return json.dumps(record).replace('"@DEEP@"', '{"a": ' * levels + "1" + "}" * levels)


def test_a_record_nested_deeper_than_cascade_writes_is_refused_by_every_reader(recorded: Recorded) -> None:
    for levels, where in ((990, "params.values"), (990, "hardware.deep"), (500, "hardware.deep"),
                          (100, "python.packages")):  # fmt: skip
        recorded.store(_nested(recorded, levels, where))
        _assert_refused(recorded, "nested more than 64 levels",
                        READERS if levels == 990 else (("show", "v1"), ("show", "v1", "--json")))  # fmt: skip


def test_a_record_nested_within_the_bound_still_shows(recorded: Recorded) -> None:
    """A params file nested 40 levels deep is odd, not hostile: shown, as JSON too."""
    record = recorded.edited()
    record["params"]["values"]["deep"] = "@DEEP@"
    recorded.store(json.dumps(record).replace('"@DEEP@"', '{"a": ' * 40 + "1" + "}" * 40))
    for args in (("show", "v1"), ("show", "v1", "--json"), ("diff", "v1", "current")):
        result = recorded.project.cascade(*args)
        assert result.returncode == 0, (args, result.stderr)
    shown = json.loads(recorded.project.cascade("show", "v1", "--json", check=True).stdout)
    deep = shown["data"]["manifest"]["params"]["values"]["deep"]
    for _ in range(40):
        deep = deep["a"]
    assert deep == 1


# -- E: what restore acts on, checked before anything is written -------------------------------------


def test_fields_the_rerun_acts_on_are_refused_before_anything_is_written(recorded: Recorded) -> None:
    def edit(section: str, key: str, value: Any) -> dict[str, Any]:
        record = recorded.edited()
        if value is _MISSING:
            del record[section][key]
        else:
            record[section][key] = value
        return record

    cases = (
        (edit("environment_read", "A=B", "1"), "environment_read"),
        (edit("environment_read", "", "1"), "environment_read"),
        (edit("environment", "CUBLAS\0X", "1"), "environment"),
        (edit("environment_read", "SOME_VAR", "a\0b"), "environment_read.SOME_VAR"),
        (edit("command", "argv", ["--lr", "0.1\0"]), "command.argv"),
        (edit("trace", "interval", -3), "trace.interval"),
        (edit("trace", "interval", "1"), "trace.interval"),
        (edit("command", "script", "-c"), "command.script"),
        (edit("command", "script", _MISSING), "command.script"),
        (edit("command", "module", "os; rm -rf x"), "command.module"),  # run as `-m NAME`: a name only
        (edit("command", "module", ["mypkg"]), "command.module"),
        (edit("determinism", "mode", "bogus"), "determinism.mode"),
    )
    for record, named in cases:
        recorded.store(record)
        _assert_refused(recorded, named, (("restore", "v1"), ("restore", "v1", "--no-run"), ("show", "v1")))
    # the record as cascade wrote it still restores (the checks refuse only what cascade never writes)
    recorded.store(recorded.record)
    result = recorded.project.cascade("restore", "v1", "--no-run")
    assert result.returncode == 0 and recorded.restore_dir.is_dir(), result.stderr


_MISSING = object()


def test_a_module_the_record_names_that_is_not_the_recorded_script_is_not_run(recorded: Recorded) -> None:
    """`command.module` is a name: `python -m pip install ...` from a record would run pip, not the
    project. The name must find the recorded script in the restored code, or nothing runs."""
    before = len(recorded.project.runs())
    record = recorded.edited()
    record["command"].update(module="pip", argv=["--version"])  # (script: still train.py)
    recorded.store(record)

    refused = recorded.project.cascade("restore", "v1")

    assert refused.returncode == 1, refused.stderr
    assert "records `-m pip` as the script train.py, which is not that module's file" in refused.stderr
    assert not recorded.restore_dir.exists()  # refused before anything was written
    # a name and a file that agree, where the restored code has no such file: python -m finds pip
    record["command"]["script"] = "pip/__main__.py"
    recorded.store(record)

    refused = recorded.project.cascade("restore", "v1")

    assert refused.returncode == 1, refused.stderr
    assert "records `-m pip` as pip/__main__.py, but from the restored code it runs" in refused.stderr
    assert "is not run" in refused.stderr
    assert "pip " not in refused.stdout  # (`pip --version` prints "pip X.Y from ...")
    assert len(recorded.project.runs()) == before  # no re-run was recorded


# -- D: a record that is not JSON, or not text -------------------------------------------------------


def test_a_truncated_or_non_utf8_record_is_malformed_not_missing(recorded: Recorded) -> None:
    text = recorded.record_file.read_bytes()
    for stored, named in ((text[: len(text) // 2], "is not readable JSON"),
                          (text.replace(b'"train.py"', b'"train\xff.py"', 1), "is not UTF-8 text"),
                          (b"[1, 2]", "is a JSON list, not an object")):  # fmt: skip
        recorded.store(stored)
        for args in (("show", "v1"), ("diff", "v1", "current"), ("restore", "v1", "--no-run")):
            result = recorded.project.cascade(*args)
            said = result.stderr
            assert result.returncode == 1, (args, said)
            malformed = f"run {recorded.run_id}: the run record is malformed: cascade/run.json {named}"
            assert malformed in said, said
            assert "has no cascade record" not in said and "not made by `cascade run`" not in said, said
            assert not recorded.restore_dir.exists()


# -- F: one bad row in the embedded store ------------------------------------------------------------


def test_one_bad_row_in_the_store_hides_no_other_run(recorded: Recorded) -> None:
    project = recorded.project
    other = project.record("train.py")
    db = project.root / "mlflow.db"

    def ls(*args: str) -> tuple[str, list[dict[str, Any]]]:
        shown = project.cascade("ls", *args)
        listed = project.cascade("ls", *args, "--json")
        assert shown.returncode == 0 and listed.returncode == 0, (args, shown.stderr, listed.stderr)
        assert "Traceback" not in shown.stderr + listed.stderr
        return shown.stdout, json.loads(listed.stdout)["data"]

    def tamper(sql: str, *values: Any) -> None:
        with sqlite3.connect(db) as connection:
            connection.execute(sql, values)

    with sqlite3.connect(db) as connection:
        start_ms, end_ms = connection.execute(
            "SELECT start_time, end_time FROM runs WHERE run_uuid = ?", (recorded.run_id,)
        ).fetchone()
    for bad in (99999999999999999, -5, "soon"):
        tamper("UPDATE runs SET start_time = ? WHERE run_uuid = ?", bad, recorded.run_id)
        for args in ((), ("--versions",)):
            text, runs = ls(*args)
            assert recorded.run_id in text and (other in text or args)
            row = next(r for r in runs if r["run_id"] == recorded.run_id)
            assert row["start_time"] is None and row["duration_s"] is None, (bad, row)
            assert "FINISHED" in text
    tamper("UPDATE runs SET start_time = ?, end_time = ? WHERE run_uuid = ?", start_ms, start_ms - 3600_000,
           recorded.run_id)  # fmt: skip
    text, runs = ls()
    assert "-3600" not in text
    assert next(r for r in runs if r["run_id"] == recorded.run_id)["duration_s"] is None
    tamper("UPDATE runs SET end_time = ? WHERE run_uuid = ?", end_ms, recorded.run_id)

    # not hex ("abc" was found in a commit id once): nothing cascade prints may contain it by chance
    tamper("UPDATE latest_metrics SET value = 'zz-tampered' WHERE run_uuid = ? AND key = 'loss'",
           recorded.run_id)  # fmt: skip
    text, runs = ls()
    row = next(r for r in runs if r["run_id"] == recorded.run_id)
    assert "loss" not in row["metrics"] and "lr" in row["metrics"], row  # the unreadable one left blank
    assert other in text and "zz-tampered" not in text
    shown = project.cascade("show", "v1")
    assert shown.returncode == 0 and "zz-tampered" not in shown.stdout, shown.stderr
    assert json.loads(project.cascade("show", "v1", "--json", check=True).stdout)["data"]


# -- B: python.packages -------------------------------------------------------------------------------


def test_a_package_without_a_version_is_refused_not_printed_as_a_pip_command(recorded: Recorded) -> None:
    for name, info in (("evil", {"origin": "x"}), ("evil", {"version": None}), ("evil", {"version": 5}),
                       ("evil", ["1.0"]), ("evil", {"version": "1.0 --index-url http://x"}),
                       ("evil; rm -rf ~", {"version": "1.0"})):  # fmt: skip
        record = recorded.edited()
        record["python"]["packages"][name] = info
        recorded.store(record)
        readers = (("check", "v1"), ("show", "v1"), ("diff", "v1", "current"))
        _assert_refused(recorded, "python.packages", readers)
    record = recorded.edited()
    record["python"]["packages"]["not-here"] = {"version": "0.0.1+cpu"}  # well formed, not installed here
    recorded.store(record)
    result = recorded.project.cascade("check", "v1")
    assert result.returncode == 1 and "NOT_RUNNABLE" in result.stdout, result
    assert "fix: pip install not-here==0.0.1+cpu" in result.stdout, result.stdout


# -- G: one enormous line in the step trace ------------------------------------------------------------

_PEAK_RSS = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.stderr.write(done.stderr); "
    "sys.exit(done.returncode)"
)


def _peak_rss_kb(project: Project, *args: str) -> tuple[int, int, str]:
    """`cascade ARGS` in a process of its own: (exit code, its peak RSS in KiB, its stderr)."""
    done = subprocess.run([sys.executable, "-c", _PEAK_RSS, *CASCADE, *args], cwd=project.root,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return done.returncode, int(done.stdout.split()[-1]), done.stderr


def test_a_trace_line_longer_than_any_model_writes_is_refused_with_bounded_memory(recorded: Recorded) -> None:
    project = recorded.project
    trace = recorded.record_file.parent / "trace.jsonl"
    readers = (("verify", "v1", "v1"), ("show", "v1", "--trace"), ("diff", "v1", "v1"))
    baseline = {}
    for args in readers:
        code, baseline[args], said = _peak_rss_kb(project, *args)
        assert code in (0, 3), (args, said)
    lines = trace.read_bytes().splitlines(keepends=True)
    padding = b"a" * (96 << 20)  # step 1's record with 96 MiB more: the tester's 300 MB line, smaller
    with trace.open("wb") as out:
        out.writelines([lines[0], lines[1].rstrip()[:-1] + b',"note":"' + padding + b'"}\n', *lines[2:]])
    del padding
    for args in readers:
        code, peak, said = _peak_rss_kb(project, *args)
        # the line is read no further than the bound: never the 96 MiB (twice over, as text and lines)
        assert peak - baseline[args] < 3 * 16 * 1024, (args, peak, baseline[args])  # 3 x the 16 MiB bound
        assert code == 1, (args, said)
        assert f"of run {recorded.run_id[:12]} is damaged at record 2: a line over 16 MiB" in said, said
        assert "Traceback" not in said and "run with -v" not in said, said


# -- H: what the record says it lacks ----------------------------------------------------------------


def test_what_the_record_says_it_lacks_must_be_a_list_of_lines(recorded: Recorded) -> None:
    """`outcome.missing` (what a full disk or a dead parent took) is printed by show and decides the
    exit code of the commands that judge a run: a number there was a traceback, a string was printed
    a character a line."""
    for bad in (5, "the output log", [1, 2], {"the output log": True}, [["nested"]]):
        record = recorded.edited()
        record["outcome"]["missing"] = bad
        recorded.store(record)
        _assert_refused(recorded, "outcome.missing", (("show", "v1"), ("show", "v1", "--json")))
    record = recorded.edited()
    record["outcome"]["missing"] = ["the output log"]
    recorded.store(record)
    shown = recorded.project.cascade("show", "v1")
    assert shown.returncode == 0 and "the output log" in shown.stdout, shown.stderr
    # null, as JSON writers spell an empty field: nothing missing, not a malformed record
    record = recorded.edited()
    record["outcome"]["missing"] = None
    recorded.store(record)
    shown = recorded.project.cascade("show", "v1", "--json")
    assert shown.returncode == 0, shown.stderr
