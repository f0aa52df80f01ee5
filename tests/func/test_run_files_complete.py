"""What a run read and wrote, whole: a file read and then rewritten (its bytes as read are an input),
inputs past the record's bound (counted and said), outputs written other than through Python's open
(sqlite, a subprocess)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

COUNTER = """\
import torch

c = int(open("data/counter.txt").read())
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01 * c)
x = torch.ones(8, 4)
for step in range(5):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
open("data/counter.txt", "w").write(str(c + 1))
print("c", c, "loss", loss.item())
"""


@pytest.fixture
def counter(project: Project) -> Project:
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "data/\n")
    project.write("count.py", COUNTER)
    project.commit("a script that reads and rewrites its counter")
    project.write("data/counter.txt", "1\n")
    return project


def _as_read() -> dict[str, object]:
    digest = hashlib.sha256(b"1\n").hexdigest()
    return {"path": "data/counter.txt", "size": 2, "sha256": digest, "rewritten": True}


def test_a_file_read_then_rewritten_is_an_input_as_read_and_restore_refuses_it(counter: Project) -> None:
    project = counter
    result = project.cascade("run", "--name", "w1", "--tag", "w1", "count.py")
    assert result.returncode == 0, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    assert record["inputs"] == [_as_read()]
    assert [o["path"] for o in record["outputs"]] == ["data/counter.txt"]
    said = " ".join(result.stderr.split())
    assert "read 1 file(s) and then rewrote or removed them (data/counter.txt)" in said
    shown = " ".join(project.cascade("show", "w1", check=True).stdout.split())
    assert "data/counter.txt (2 bytes, as read: the run rewrote it)" in shown

    restored = project.cascade("restore", "w1")
    assert restored.returncode == 1, restored.stderr
    refusal = " ".join(restored.stderr.split())
    assert "data/counter.txt (changed since the run: it read 2 bytes with sha256 4355a46b19d3" in refusal


def test_with_dvc_the_bytes_as_read_are_kept_and_restore_gives_them_back(counter: Project) -> None:
    project = counter
    project.cascade("init", check=True)
    project.commit("cascade init")
    result = project.cascade("run", "--tag", "w1", "count.py")
    assert result.returncode == 0, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    md5 = hashlib.md5(b"1\n").hexdigest()
    assert record["inputs"] == [{**_as_read(), "md5": md5}]
    assert (project.root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).read_bytes() == b"1\n"
    assert (project.root / "data" / "counter.txt").read_text() == "2"
    assert "kept 1 input file(s) in the DVC cache as the run read them" in " ".join(result.stderr.split())

    restored = project.cascade("restore", "w1", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["plan"]["input_sources"] == {"data/counter.txt": "dvc"}
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]
    assert (Path(data["worktree"]["path"]) / "data" / "counter.txt").read_text() == "2"  # 1 read, rewritten


READ_ALL = """\
from pathlib import Path

total = sum(len(p.read_bytes()) for p in sorted(Path("shards").iterdir()))
print("read", total)
"""


def test_inputs_past_the_record_bound_are_counted_and_said(project: Project) -> None:
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "shards/\n")
    project.write("read_all.py", READ_ALL)
    project.commit("reads many small files")
    shards = project.root / "shards"
    shards.mkdir()
    for i in range(10_007):
        (shards / f"{i:05d}.txt").write_text(f"shard {i}\n")
    started = time.monotonic()
    result = project.cascade("run", "--tag", "many", "read_all.py")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    record = project.manifest(project.only_run().info.run_id)
    assert len(record["inputs"]) == 10_000
    first = record["inputs"][0]
    assert first == {
        "path": "shards/00000.txt",
        "size": 8,
        "sha256": hashlib.sha256(b"shard 0\n").hexdigest(),
    }
    assert record["outcome"]["inputs_not_recorded"] == 7
    assert "7 more input file(s) were read than the record holds (10000)" in " ".join(result.stderr.split())
    shown = " ".join(project.cascade("show", "many", check=True).stdout.split())
    assert "10007 file(s) not tracked by git or DVC, 7 of them NOT recorded" in shown
    restored = project.cascade("restore", "many", "--no-run")  # (it said nothing of the 7)
    assert restored.returncode == 0, restored.stderr
    assert "the run read 7 more input file(s) than its record holds" in " ".join(restored.stderr.split())
    print(f"10,007 inputs: run {took:.1f} s, record {len(json.dumps(record)) / 1e6:.2f} MB")


OTHER_WRITERS = """\
import sqlite3
import subprocess
import sys
from pathlib import Path

Path("results").mkdir(exist_ok=True)
db = sqlite3.connect("results/metrics.db")
db.execute("create table if not exists m (step int, loss real)")
db.execute("insert into m values (1, 0.5)")
db.commit()
db.close()
subprocess.run([sys.executable, "-c", "open('results/from_child.txt', 'w').write('hi')"], check=True)
"""


def test_untracked_files_written_by_sqlite_or_a_subprocess_are_outputs(project: Project) -> None:
    project.write("others.py", OTHER_WRITERS)
    project.write("notes.txt", "the user's own untracked file")
    project.commit("writes through sqlite and a subprocess")
    project.write("mine.txt", "untracked before the run: dirty state, not an output")
    project.cascade("run", "others.py", check=True)
    (first,) = project.runs()
    record = project.manifest(first.info.run_id)
    assert sorted(o["path"] for o in record["outputs"]) == ["results/from_child.txt", "results/metrics.db"]
    assert [u["path"] for u in record["git"]["untracked"]] == ["mine.txt"]
    (project.root / "mine.txt").unlink()

    second = project.record("--require-clean", "others.py")  # nothing the last run wrote is dirty
    record = project.manifest(second)
    assert record["git"]["untracked"] == [] and record["git"]["dirty"] is False
    # each is left out as the last run's output, or (capture runs beside the script) was rewritten by
    # this run before capture looked, and is this run's output
    earlier = {e["path"] for e in record["git"].get("earlier_outputs") or []}
    written = {o["path"] for o in record["outputs"]}
    assert earlier | written == {"results/from_child.txt", "results/metrics.db"}
