"""The relay of the script's output and the progress line (run_output.py), on real files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cascade_repro.child import protocol
from cascade_repro.run_output import STDERR, STDOUT, Progress, RunOutput


def test_lines_are_relayed_whole_in_the_order_they_were_completed(tmp_path: Path) -> None:
    output = RunOutput(tmp_path / "output.log", tmp_path, progress=False)
    output.feed(STDOUT, b"step 1 ")
    output.feed(STDERR, b"warning: x\n")
    output.feed(STDOUT, b"done\nstep 2")
    output.feed(STDOUT, b" done\n")
    assert output.close() is None
    assert (tmp_path / "output.log").read_bytes() == b"warning: x\nstep 1 done\nstep 2 done\n"


def test_a_line_without_its_end_is_passed_on_after_a_moment(tmp_path: Path) -> None:
    output = RunOutput(tmp_path / "output.log", tmp_path, progress=False)
    output.feed(STDOUT, b"continue? [y/n] ")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (tmp_path / "output.log").read_bytes():
        time.sleep(0.02)
    assert (tmp_path / "output.log").read_bytes() == b"continue? [y/n] "
    output.feed(STDOUT, b"y\n")
    output.feed(STDOUT, b"no newline at exit")
    output.close()
    assert (tmp_path / "output.log").read_bytes() == b"continue? [y/n] y\nno newline at exit"


def test_progress_reads_the_last_traced_step_and_metric(tmp_path: Path) -> None:
    progress = Progress(tmp_path)
    assert progress.line(time.monotonic()).startswith("running · ")
    assert not progress.moved()
    (tmp_path / protocol.TRACE_FILE).write_text(
        "".join(json.dumps({"step": k, "loss": {"value": 1.0}}) + "\n" for k in range(12))
        + '{"step": 12, "lo'
    )
    (tmp_path / protocol.EVENTS_FILE).write_text(
        json.dumps([1.0, 11, {"acc": 0.5, "train_loss": 0.25}])
        + "\n"
        + json.dumps([1.0, 11, {"lr": 0.1}])
        + "\n"
    )
    line = progress.line(time.monotonic())
    assert line.startswith("step 12 · lr 0.1 · ") and line.endswith("s")
    assert progress.moved() and not progress.moved()
    (tmp_path / protocol.EVENTS_FILE).write_text(
        json.dumps([1.0, 11, {"acc": 0.5, "train_loss": 0.25}]) + "\n"
    )
    assert progress.line(time.monotonic()).startswith("step 12 · train_loss 0.25 · ")


def test_a_progress_line_after_a_bar_drawn_with_carriage_returns_starts_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_PROGRESS_EVERY", "0.01")
    (tmp_path / protocol.TRACE_FILE).write_text(json.dumps({"step": 4}) + "\n")
    output = RunOutput(tmp_path / "output.log", tmp_path)
    output.feed(STDERR, b" 40%|####      | 4/10\r")
    seen = ""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "cascade: step 5" not in seen:
        time.sleep(0.05)
        seen += capfd.readouterr().err
    output.close()
    assert " 4/10\r\ncascade: step 5 · " in seen  # not glued to the bar's line
    assert (tmp_path / "output.log").read_bytes() == b" 40%|####      | 4/10\r"


def test_a_notice_during_a_prompt_waits_for_its_line_and_after_a_bar_starts_its_own(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import sys

    output = RunOutput(tmp_path / "output.log", tmp_path, progress=False)
    notify = output.wrap(lambda message: print(f"cascade: {message}", file=sys.stderr, flush=True))
    output.feed(STDERR, b"continue? ")
    deadline = time.monotonic() + 5
    seen = ""
    while time.monotonic() < deadline and "continue? " not in seen:  # passed on as a partial line
        time.sleep(0.02)
        seen += capfd.readouterr().err
    notify("run abc opened")
    time.sleep(0.3)
    seen += capfd.readouterr().err
    assert seen == "continue? "  # held: the prompt's line is not cut
    output.feed(STDERR, b"yes\n")
    seen += capfd.readouterr().err
    assert seen == "continue? yes\ncascade: run abc opened\n"
    output.feed(STDERR, b"\r 10%|#   |")
    output.feed(STDERR, b"\r 20%|##  |\r")
    notify("a checkpoint kept")  # a bar may stay for an epoch: a line of its own now
    output.close()
    assert capfd.readouterr().err == "\r 10%|#   |\r 20%|##  |\r\ncascade: a checkpoint kept\n"
