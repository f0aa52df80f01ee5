"""What `cascade run` prints while the script runs (issue 19, item 2): the script's lines whole and
in order, then the summary; progress in place on a terminal, plain lines in a redirected log."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import time

from tests.plugin import CASCADE, Project

INTERLEAVED = """\
import sys
import time

for i in range(40):
    sys.stdout.write(f"out {i} ")
    sys.stdout.flush()
    sys.stderr.write(f"err {i} ")
    sys.stderr.flush()
    sys.stdout.write("end\\n")
    sys.stderr.write("end\\n")
sys.stdout.write("continue? ")
sys.stdout.flush()
time.sleep(0.5)
print("yes")
print("last line of the script")
"""

STEPS = """\
import time

import torch

import cascade_repro

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(50):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    cascade_repro.log_metrics({"train_loss": loss.item()}, step=step)
    time.sleep(0.06)
    if step == 25:
        print("halfway")
"""


def test_a_redirected_log_has_the_scripts_lines_whole_and_in_order_before_the_summary(
    project: Project,
) -> None:
    project.write("interleaved.py", INTERLEAVED)
    project.commit("interleaved output")
    log = project.root / "out" / "run.log"
    log.parent.mkdir()
    with open(log, "wb") as handle:  # one file for both streams, as `> run.log 2>&1` gives
        code = subprocess.run([*CASCADE, "run", "interleaved.py"], cwd=project.root, stdout=handle,
                              stderr=subprocess.STDOUT, timeout=300).returncode  # fmt: skip
    assert code == 0
    lines = log.read_text().splitlines()
    script = [line for line in lines if not line.startswith("cascade: ")]
    assert sorted(script[:80]) == sorted(
        [f"out {i} end" for i in range(40)] + [f"err {i} end" for i in range(40)]
    )
    assert [line for line in script if line.startswith("out ")] == [f"out {i} end" for i in range(40)]
    assert script[80:] == ["continue? yes", "last line of the script"]
    finished = next(i for i, line in enumerate(lines) if " FINISHED in " in line)
    assert finished > lines.index("last line of the script")
    stored = next((project.root / "mlruns").rglob("output.log")).read_text().splitlines()
    assert sorted(stored) == sorted(script)


def test_progress_is_one_line_redrawn_in_place_on_a_terminal(project: Project) -> None:
    project.write("steps.py", STEPS)
    project.commit("steps")
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm"}
    process = subprocess.Popen([*CASCADE, "run", "steps.py"], cwd=project.root, stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=follower, env=env)  # fmt: skip
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: cascade exited
            break
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=60) == 0
    os.close(leader)
    text = seen.decode()
    redraws = re.findall(r"\r\x1b\[Kcascade: step ([\d,]+) · train_loss [-\d.e]+ · \d+s", text)
    assert len(redraws) >= 3 and int(redraws[-1].replace(",", "")) == 50
    steps = [int(s.replace(",", "")) for s in redraws]
    assert steps == sorted(steps)  # it moves forward
    # the script's own line is printed over a cleared progress line, never glued to it
    assert re.search(r"\r\x1b\[Khalfway\r?\n", text)
    # and the summary comes on a line of its own, the last progress line cleared before it (under
    # load the run's id line may come late, after the script's end: it clears the progress line)
    summary = re.search(r"cascade: run \w+ FINISHED in ", text)
    assert summary, text
    before = text[: summary.start()]
    assert before.endswith(("\r\x1b[K", "\n")), before[-200:]
    assert "\r\x1b[K" in before[before.rfind("\r\x1b[Kcascade: step") + 1 :], before[-200:]


def test_progress_in_a_redirected_log_is_plain_lines(project: Project) -> None:
    project.write("steps.py", STEPS)
    project.commit("steps")
    result = project.cascade("run", "steps.py", env={"CASCADE_PROGRESS_EVERY": "0.5"})
    assert result.returncode == 0, result.stderr
    progress = [
        line
        for line in result.stderr.splitlines()
        if re.fullmatch(r"cascade: (step [\d,]+|running) · .*", line)
    ]
    assert len(progress) >= 2, result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
    quiet = project.cascade("run", "steps.py", env={"CASCADE_PROGRESS_EVERY": "0"})
    assert quiet.returncode == 0 and not re.search(r"^cascade: step ", quiet.stderr, re.M)
