"""What the script logged before its `cascade run` parent died is all delivered: the child gets SIGTERM
(PR_SET_PDEATHSIG) wherever it is, inside a flush of the metrics or the trace too, and must still write
every point it logged and every step it completed; the next command (`cascade ls`) stores them all.

A SIGTERM used to raise SystemExit inside the script's `cascade_repro.flush()`: the points it had taken
off the queue and not yet written were gone (3000 points of one step, 785 written). The trace writer
dropped the records it was encoding when the exception came (`finally: clear()`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.faults.helpers import Background, process_gone
from tests.plugin import Project

# Logs POINTS points a step (key "n", step = s * POINTS + i) and the step's loss, writes out/logged
# (the last step whose points were logged, fsync'd), then flushes: the test kills the parent as soon as
# it sees the marker, while the flush of 10,000 points is still under way.
POINTS = 10000
SCRIPT = """\
import os, sys, time
from pathlib import Path
import torch
import cascade_repro

POINTS = int(sys.argv[1])
out = Path("out")
out.mkdir(exist_ok=True)
(out / "started").write_text(str(os.getpid()))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 4)


def mark(step):
    with open("out/logged.tmp", "w") as handle:
        handle.write(str(step))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace("out/logged.tmp", "out/logged")


done = 0  # "n" points logged (returned from log_metrics), written down however the script ends
try:
    for step in range(100000):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        cascade_repro.log_metrics({"loss": loss.item()}, step=step)
        for i in range(POINTS):
            cascade_repro.log_metrics({"n": float(i)}, step=step * POINTS + i)
            done += 1
        mark(step)
        cascade_repro.flush()
finally:  # (the SIGTERM's SystemExit passes here before the exit's flush)
    with open("out/points", "w") as handle:
        handle.write(str(done))
        handle.flush()
        os.fsync(handle.fileno())
"""


@pytest.mark.slow
def test_every_point_logged_before_the_parent_died_is_stored(project: Project) -> None:
    project.write("points.py", SCRIPT)
    project.commit("points script")
    run = Background(project, "points.py", str(POINTS))
    marker = project.root / "out" / "logged"
    run.wait_for(lambda: marker.exists(), "step 0")
    deadline = time.monotonic() + 60
    while marker.read_text() in ("", "0") and time.monotonic() < deadline:  # in step 1's flush, as a rule
        time.sleep(0.001)
    spool = run.run_dir()
    assert spool is not None
    os.kill(run.process.pid, signal.SIGKILL)  # the parent only: the child learns it from the kernel
    run.process.wait(timeout=30)
    child = int((project.root / "out" / "started").read_text())
    assert process_gone(child, 30), "the script went on running without its parent"
    last = int((project.root / "out" / "logged").read_text())

    listed = project.cascade("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "recovered" in listed.stderr
    run_id = project.only_run().info.run_id
    client = project.client()
    loss_steps = sorted(m.step for m in client.get_metric_history(run_id, "loss"))
    n_steps = sorted(m.step for m in client.get_metric_history(run_id, "n"))
    # Every step up to the marker, and at most the one the SIGTERM cut between its log and its marker.
    logged = last + 1 if loss_steps and loss_steps[-1] == last + 1 else last
    # (under load the SIGTERM may come inside the next step's loop of points: those it logged count)
    done = int((project.root / "out" / "points").read_text())
    print(f"\nFIGURES parent SIGKILL in a flush: marker step {last}, stored loss steps {len(loss_steps)}, "
          f"n points {len(n_steps)} of {done} logged")  # fmt: skip
    assert loss_steps == list(range(logged + 1))
    assert done >= (last + 1) * POINTS
    assert n_steps == list(range(len(n_steps))) and done <= len(n_steps) <= done + 1, (
        f"{done - len(set(n_steps))} point(s) the script logged are not in the store"
    )  # (+1: the SIGTERM came inside a log_metrics call that had queued its point)

    trace = Path(client.download_artifacts(run_id, "cascade/trace.jsonl", str(project.root / ".dl")))
    steps = [json.loads(line)["step"] for line in trace.read_text().splitlines() if line.strip()]
    assert steps[: logged + 1] == list(range(logged + 1)), f"trace steps {steps}"
    assert len(steps) == len(set(steps)), f"a step recorded twice: {steps}"


# -- the child's writers, in this process: a signal handler's exception at any point of a flush --------
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_an_exception_inside_a_flush_of_the_events_loses_no_point(tmp_path: Path) -> None:
    """SIGUSR1 every few milliseconds; its handler raises KeyboardInterrupt (as the child's SIGTERM
    handler raises SystemExit) in the main thread wherever it is while the script's flush() runs."""
    from cascade_repro.child.events import EventSink

    armed, raised = [False], [0]

    def handler(signum: int, frame: object) -> None:
        if armed[0]:
            raised[0] += 1
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    stop = threading.Event()

    def send() -> None:
        while not stop.wait(0.002):
            os.kill(os.getpid(), signal.SIGUSR1)

    path = tmp_path / "events.jsonl"
    sink = EventSink(path)
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    logged = 0
    deadline = time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline or raised[0] < 20:
            for _ in range(2000):
                sink.add({"n": float(logged)}, step=logged)
                logged += 1
            try:
                armed[0] = True
                sink.flush()
            except KeyboardInterrupt:
                pass
            finally:
                armed[0] = False
    finally:
        stop.set()
        sender.join()  # (a signal sent after the default action is back would end pytest, and make)
        signal.signal(signal.SIGUSR1, previous)
    sink.close()
    steps = [json.loads(line)[1] for line in path.read_text().splitlines()]
    print(f"\nFIGURES {raised[0]} interrupted flushes: {logged} logged, {len(set(steps))} written")
    assert raised[0] >= 20
    assert len(steps) == len(set(steps)), "points written twice"
    assert sorted(steps) == list(range(logged)), f"{logged - len(set(steps))} point(s) lost"


def test_an_exception_inside_a_flush_of_the_trace_keeps_its_records(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from cascade_repro.child import trace_writer

    writer = trace_writer.TraceWriter(torch, tmp_path / "trace.jsonl")
    encode = writer._encode
    calls = [0]

    def interrupted(record: dict[str, object]) -> str:
        calls[0] += 1
        if calls[0] == 3:  # the SIGTERM's SystemExit, in the middle of the records' encoding
            raise SystemExit(143)
        return encode(record)

    writer._encode = interrupted  # type: ignore[method-assign]
    rng = {"torch": torch.get_rng_state()}
    for step in range(5):
        writer.write({"step": step, "rng": rng, "loss": torch.tensor(0.5 + step)})
    with pytest.raises(SystemExit):
        writer.flush()
    writer.close()  # at exit
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 4]
    assert lines[4]["loss"]["value"] == 4.5 and isinstance(lines[4]["rng"]["torch"], str)
