"""How runs end: crash, exit codes, Ctrl-C and SIGTERM keep what was recorded; metrics batching."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time

import pytest

from tests.plugin import CASCADE, Project, wait_for_file

pytestmark = pytest.mark.slow


def _loss_steps(project: Project, run_id: str) -> list[int]:
    return sorted(m.step for m in project.client().get_metric_history(run_id, "loss"))


def test_crash_is_failed_with_metrics_before_it(project: Project) -> None:
    result = project.cascade("run", "train.py", "--crash")
    assert result.returncode == 1  # what `python train.py --crash` exits with
    assert "boom at half time" in result.stderr  # the traceback streamed through
    run = project.only_run()
    assert run.info.status == "FAILED"
    assert _loss_steps(project, run.info.run_id) == list(range(11))  # steps 0..10 logged before the raise
    manifest = project.manifest(run.info.run_id)
    assert manifest["outcome"]["status"] == "FAILED"
    assert manifest["outcome"]["error"] == {"type": "RuntimeError", "message": "boom at half time"}
    assert manifest["outcome"]["exit_code"] == 1


def test_exit_code_is_the_scripts(project: Project) -> None:
    result = project.cascade("run", "train.py", "--exit", "7")
    assert result.returncode == 7
    run = project.only_run()
    assert run.info.status == "FAILED"
    assert project.manifest(run.info.run_id)["outcome"]["exit_code"] == 7


@pytest.mark.parametrize(
    ("sig", "exit_code", "to_group"),
    [(signal.SIGINT, 130, True), (signal.SIGINT, 130, False), (signal.SIGTERM, 143, False)],
    ids=["ctrl-c-terminal", "sigint-parent-only", "sigterm-parent"],
)
def test_signal_is_killed_with_everything_recorded(
    project: Project, sig: int, exit_code: int, to_group: bool
) -> None:
    """Ctrl-C at a terminal reaches the whole process group; kill(1) reaches only the parent."""
    process = subprocess.Popen(
        [*CASCADE, "run", "train.py", "--hang"], cwd=project.root, env=dict(os.environ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    wait_for_file(project.root / "out" / "ready", process)
    time.sleep(1.0)  # let the parent open the run and write the manifest
    if to_group:
        os.killpg(process.pid, sig)
    else:
        process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == exit_code, stderr
    run = project.only_run()
    assert run.info.status == "KILLED"
    assert _loss_steps(project, run.info.run_id) == list(range(20))
    manifest = project.manifest(run.info.run_id)
    assert manifest["outcome"]["status"] == "KILLED"
    assert manifest["outcome"]["signal"] == sig
    assert manifest["git"]["commit"]  # the capture made before the signal is kept
    if sig == signal.SIGINT:  # the script unwound through KeyboardInterrupt, an exception with no message
        assert manifest["outcome"]["error"] == {"type": "KeyboardInterrupt", "message": ""}
        shown = project.invoke("show", run.info.run_id, check=True).stdout
        (error,) = [line.split(None, 1)[1] for line in shown.splitlines() if line.split()[:1] == ["error"]]
        assert error.strip() == "KeyboardInterrupt"  # not "KeyboardInterrupt:"


def test_script_mlflow_calls_land_in_the_same_run(project: Project) -> None:
    ran = project.cascade("run", "train.py", "--mlflow", check=True)
    seen = json.loads((project.root / "out/seen.json").read_text())
    run = project.only_run()  # exactly one run: mlflow.log_* did not start another
    assert run.data.metrics["from_mlflow"] == 42.0
    assert run.data.params["from_mlflow_param"] == "yes"
    assert run.data.metrics["loss"] > 0
    assert seen["mlflow_tracking_uri"] == f"sqlite:///{project.root / 'mlflow.db'}"
    assert run.info.status == "FINISHED"
    # the closing line names what the script logged through MLflow too, after cascade's own (it
    # named only those: a framework's own logger, HF's or Lightning's, left it without metrics)
    ended = f"cascade: run {run.info.run_id} FINISHED"
    (closing,) = [line for line in ran.stderr.splitlines() if line.startswith(ended)]
    assert "from_mlflow=42" in closing and closing.index("loss=") < closing.index("from_mlflow=")


def test_metrics_are_written_in_batches_of_at_most_1000(project: Project) -> None:
    project.write("cascade.yaml", "metrics_flush_s: 600\n")  # only full batches, then the rest at exit
    project.commit("slow flush")
    project.cascade("run", "train.py", "--points", "2500", check=True)
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)
    history = project.client().get_metric_history(run.info.run_id, "extra")
    assert sorted((m.step, m.value) for m in history) == [(i, float(i)) for i in range(2500)]
    points = manifest["metrics"]["points"]
    assert points == 2500 + 2 * 20 + 1  # extra + loss and lr per step + the peak-RSS figure
    assert manifest["metrics"]["requests"] == math.ceil(points / 1000)
    assert manifest["metrics"]["keys"]["extra"] == {"count": 2500, "last": 2499.0, "min": 0.0, "max": 2499.0}
    assert run.data.metrics["cascade.peak_rss_mb"] > 10


def test_a_script_that_ignores_ctrl_c_and_finishes_is_finished_not_killed(project: Project) -> None:
    project.write(
        "stubborn.py",
        # it ignores Ctrl-C (a handler that only notes it came), and ends once it came: a fixed sleep
        # could end before a loaded machine delivered it
        "import signal, time, pathlib\nimport cascade_repro\n"
        "signal.signal(signal.SIGINT, lambda *_: pathlib.Path('out/got').write_text('1'))\n"
        "pathlib.Path('out').mkdir(exist_ok=True)\npathlib.Path('out/ready').write_text('1')\n"
        "deadline = time.monotonic() + 120\n"
        "while not pathlib.Path('out/got').exists() and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
        "cascade_repro.log_metrics({'done': 1.0}, step=0)\n",
    )
    project.commit("stubborn")
    process = subprocess.Popen([*CASCADE, "run", "stubborn.py"], cwd=project.root, env=dict(os.environ),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for_file(project.root / "out" / "ready", process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)
    assert run.info.status == "FINISHED" and manifest["outcome"]["status"] == "FINISHED"
    assert manifest["outcome"]["signal"] == signal.SIGINT and run.data.metrics["done"] == 1.0


def test_a_ctrl_c_that_the_script_turns_into_another_error_still_ends_it_as_interrupted(
    project: Project,
) -> None:
    """A tester's Ctrl-C landed while numpy was importing: the import failed half-way, the next import
    raised `ImportError: cannot load module more than once per process`, and `cascade run` exited 1
    (KILLED, exit 1) where every other Ctrl-C exits 130."""
    project.write(
        "interrupted.py",
        "import os, signal, time\ntry:\n    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, mid-import\n"
        "    time.sleep(5)\nexcept KeyboardInterrupt:\n    pass\n"
        "raise ImportError('cannot load module more than once per process')\n",
    )
    project.commit("interrupted")
    result = project.cascade("run", "interrupted.py")
    assert result.returncode == 130, result.stderr
    assert "ImportError: cannot load module more than once per process" in result.stderr  # its traceback
    manifest = project.manifest(project.only_run().info.run_id)
    assert manifest["outcome"]["status"] == "KILLED" and manifest["outcome"]["exit_code"] == 130


CLEANS_UP = """\
import os, pathlib, time
import cascade_repro
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
try:
    cascade_repro.log_metrics({"loss": 1.0}, step=0)
    (out / "ready").write_text(str(os.getpid()))
    while True:
        time.sleep(0.01)
finally:  # the script's own clean-up after the stop: a second exception here cuts it short
    (out / "cleanup").write_text("started")  # (shorter than the second the child ignores a repeat for:
    deadline = time.monotonic() + 0.3  # a repeat forwarded later than that, under load, is the user's)
    while time.monotonic() < deadline:
        time.sleep(0.01)
    (out / "cleanup").write_text("done")
"""


def _cleaning_up(project: Project) -> subprocess.Popen[str]:
    """`cascade run cleans_up.py` in a session of its own, once its script is in its loop."""
    process = subprocess.Popen(
        [*CASCADE, "run", "cleans_up.py"], cwd=project.root, env=dict(os.environ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    wait_for_file(project.root / "out" / "ready", process)
    time.sleep(0.5)
    return process


def test_a_stop_sent_to_the_whole_group_ends_the_script_once(project: Project) -> None:
    """`systemctl stop`, Slurm's scancel and `timeout` signal every process of the job: the script
    gets SIGTERM itself and again from its `cascade run` parent, which forwards what it gets. The
    second raised another SystemExit in the middle of the script's clean-up."""
    sig, exit_code = signal.SIGTERM, 143
    project.write("cleans_up.py", CLEANS_UP)
    project.commit("cleans up")
    process = _cleaning_up(project)
    os.killpg(process.pid, sig)
    _, stderr = process.communicate(timeout=120)

    assert (project.root / "out" / "cleanup").read_text() == "done", stderr
    assert process.returncode == exit_code, stderr
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)
    assert run.info.status == "KILLED" and manifest["outcome"]["signal"] == sig
    assert manifest["outcome"]["exit_code"] == exit_code
    assert _loss_steps(project, run.info.run_id) == [0]


def test_nohup_keeps_the_run_going_when_the_terminal_hangs_up(project: Project) -> None:
    """`nohup cascade run train.py &`, then the ssh session ends: SIGHUP reaches the job, which nohup
    set to be ignored. cascade's parent replaced that with its forwarding handler and stopped the
    training with a SIGTERM."""
    project.write(
        "long.py",
        "import pathlib, time\nimport cascade_repro\npathlib.Path('out').mkdir(exist_ok=True)\n"
        "pathlib.Path('out/ready').write_text('1')\ntime.sleep(2)\n"
        "cascade_repro.log_metrics({'done': 1.0}, step=0)\n",
    )
    project.commit("long")
    process = subprocess.Popen(
        ["nohup", *CASCADE, "run", "long.py"], cwd=project.root, env=dict(os.environ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    wait_for_file(project.root / "out" / "ready", process)
    os.killpg(process.pid, signal.SIGHUP)  # the terminal's hang-up, to the whole job
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    run = project.only_run()
    manifest = project.manifest(run.info.run_id)
    assert run.info.status == "FINISHED" and manifest["outcome"]["status"] == "FINISHED", stderr
    assert manifest["outcome"]["signal"] is None and run.data.metrics["done"] == 1.0


def test_a_parent_killed_stops_the_script_once(project: Project) -> None:
    """kill -9 of `cascade run`: the kernel sends the script its parent-death SIGTERM each time the
    thread it counts as its parent exits, and a dying process's threads exit one by one (the script
    is handed from one to the next): several SIGTERMs within milliseconds. The second cut the
    script's clean-up (CI: a test script's `finally` lost its one write)."""
    from tests.faults.helpers import process_gone

    project.write("cleans_up.py", CLEANS_UP)
    project.commit("cleans up")
    for attempt in range(3):  # (how many threads still run when the kill comes varies)
        (project.root / "out" / "cleanup").unlink(missing_ok=True)
        (project.root / "out" / "ready").unlink(missing_ok=True)
        process = _cleaning_up(project)
        child = int((project.root / "out" / "ready").read_text())
        process.kill()
        process.communicate(timeout=60)
        assert process_gone(child, 30), "the script outlived its parent"
        assert (project.root / "out" / "cleanup").read_text() == "done", f"attempt {attempt}"
