"""The disk under `.cascade/replays` is full when `cascade verify --replay` saves the tensors of the
divergent step: the replays still run and are verified, nothing partial is left, and the verdict
says what was not measured, why and what to do, instead of torch's writer error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.faults.helpers import small_tmpfs
from tests.plugin import Project

pytestmark = [pytest.mark.slow, pytest.mark.requires_root]


@pytest.fixture
def full_replays_dir(project: Project) -> Iterator[Path]:
    """`.cascade/replays` on a 1 MiB tmpfs filled to the last byte (root only)."""
    with small_tmpfs(project.root / ".cascade" / "replays", "1m") as replays:
        filler = os.open(replays / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(filler)
        assert os.statvfs(replays).f_bavail == 0
        yield replays


def test_a_full_disk_while_the_replay_saves_tensors_is_said_and_loses_nothing(
    project: Project, full_replays_dir: Path
) -> None:
    a = project.record("--trace-budget", "0", "train.py")
    b = project.record("--trace-budget", "0", "train.py", env={"PERTURB_AT_STEP": "5"})
    result = project.cascade("verify", a, b, "--replay", "--json")
    assert result.returncode == 3, result.stderr  # the divergence is found and said all the same
    assert "Traceback" not in result.stderr and "inline_container" not in result.stderr
    verdict = json.loads(result.stdout)["data"]
    assert verdict["first_divergence"]["step"] == 5 and verdict["first_divergence"]["magnitudes"] == []
    (reason,) = verdict["replay"]["not_measured"]
    assert "step5" in reason and "0 bytes free on its disk" in reason, reason
    assert "Free space on that disk" in reason and f"cascade verify {a[:12]} {b[:12]} --replay" in reason
    # the replays ran to the end and reproduced their runs (the saving stopped, not the trace), and
    # no partial file is left where the next replay would read it
    client = project.client()
    for replayed in verdict["replay"]["runs"].values():
        assert client.get_run(replayed).data.tags["cascade.verdict"] == "BITWISE_IDENTICAL"
    assert not list(full_replays_dir.rglob("*.pt"))
    # the verdict is recorded on the later run like any other
    report = client.download_artifacts(b, f"cascade/verify/{a}.json", str(project.root / ".dl"))
    assert json.loads(Path(report).read_text())["replay"]["not_measured"] == [reason]
