"""The child's open() hook (issue 14.6/14.7): which files in the repository the script read or wrote."""

from __future__ import annotations

import builtins
import io
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cascade_repro.capture.files import read_opened
from cascade_repro.child.file_access import FileAccess


@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FileAccess, Path]:
    for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "unlink"), (os, "remove"),
                         (os, "rename"), (os, "replace"), (os, "truncate")):  # fmt: skip
        monkeypatch.setattr(module, name, getattr(module, name))  # put back after the test
    for kind in ("supports_dir_fd", "supports_fd", "supports_follow_symlinks", "supports_effective_ids"):
        monkeypatch.setattr(os, kind, set(getattr(os, kind)))
    root = tmp_path / "repo"
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.bin").write_bytes(np.arange(16, dtype=np.uint16).tobytes())
    (root / "venv").mkdir()
    (root / "venv" / "lib.txt").write_text("a package's file")
    (tmp_path / "outside.txt").write_text("not in the repository")
    monkeypatch.chdir(root)
    access = FileAccess(str(root), skip=(str(root / "venv"),))
    access.install()
    return access, root


def test_reads_and_writes_inside_the_root_are_noted_once(watched: tuple[FileAccess, Path]) -> None:
    access, root = watched
    for _ in range(3):
        np.memmap("data/train.bin", dtype=np.uint16, mode="r")  # numpy goes through open()
    Path("data/train.bin").read_bytes()  # pathlib goes through io.open
    with open(root / "out.txt", "w") as handle:
        handle.write("written")
    os.close(os.open("log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND))
    with open(root.parent / "outside.txt") as handle:
        handle.read()
    with open("venv/lib.txt") as handle:  # skipped: an environment inside the repository
        handle.read()
    facts = access.facts()
    assert facts == {"read": ["data/train.bin"], "written": ["out.txt", "log.txt"], "truncated": False}


def test_a_failed_open_is_not_noted_and_raises_as_before(watched: tuple[FileAccess, Path]) -> None:
    access, _ = watched
    with pytest.raises(FileNotFoundError), open("data/missing.bin", "rb"):
        pass
    assert open.__name__ == "open" and io.open is builtins.open
    assert access.facts()["read"] == []


def test_forked_workers_add_what_they_open_to_the_log(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """A DataLoader worker (fork) inherits the hook and the O_APPEND log: what it reads is noted too."""
    access, root = watched
    log = tmp_path / "files.jsonl"
    access.log = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with open("data/train.bin", "rb"):
        pass
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            with open(root / "data" / "worker.txt", "w") as handle:
                handle.write("x")
            with open("data/train.bin", "rb"):  # seen by the parent already: not again
                pass
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    log.write_text(log.read_text() + '{"read": "cut sh')  # a process killed mid-line
    # (this test's own read of its log, outside the repository, is none: this process wrote it first)
    assert read_opened(log) == {"read": ["data/train.bin"], "written": ["data/worker.txt"], "as_read": {},
                                "outside": []}  # fmt: skip


def test_a_file_read_and_then_rewritten_is_hashed_and_kept_as_read_before_the_write(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """Defect A: the bytes the run read survive its rewrite (a hash and a copy, taken before the open
    that truncates), once; a file only written, or written before it is read, costs nothing."""
    import hashlib

    access, root = watched
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = os.open(run_dir / "files.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    access.log, access.keep_dir = log, str(run_dir / "read_before_write")
    for rel, content in (("counter.txt", b"1\n"), ("state.txt", b"old state")):  # (io.FileIO: not hooked)
        with io.FileIO(root / "data" / rel, "w") as setup:
            setup.write(content)
    count = int(Path("data/counter.txt").read_text())
    Path("data/counter.txt").write_text(str(count + 1))  # truncates what the run read
    with open("data/counter.txt", "a") as again:  # a second write: already noted, not hashed again
        again.write("0")
    with open("data/state.txt", "r+") as both:  # reads and writes in one open
        both.write("new")
    with open("fresh.txt", "w") as fresh:  # written first, then read: its own output
        fresh.write("x")
    Path("fresh.txt").read_text()
    os.close(log)
    opened = read_opened(run_dir / "files.jsonl")
    assert opened["as_read"] == {
        "data/counter.txt": {"sha256": hashlib.sha256(b"1\n").hexdigest(), "size": 2, "kept": True},
        "data/state.txt": {"sha256": hashlib.sha256(b"old state").hexdigest(), "size": 9, "kept": True},
    }
    assert (run_dir / "read_before_write" / "data" / "counter.txt").read_bytes() == b"1\n"
    assert (run_dir / "read_before_write" / "data" / "state.txt").read_bytes() == b"old state"
    assert (root / "data" / "counter.txt").read_text() == "20"
    assert opened["read"] == ["data/counter.txt", "data/state.txt", "fresh.txt"]
    assert opened["written"] == ["data/counter.txt", "data/state.txt", "fresh.txt"]


def test_files_read_then_removed_or_renamed_away_keep_their_bytes_as_read(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """Defect 2: os.remove/os.unlink, shutil.rmtree (unlinks by dir_fd), os.rename away and os.replace
    over a file the run read: each keeps its bytes as read (once); a file never read costs nothing."""
    import hashlib
    import shutil

    access, root = watched
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = os.open(run_dir / "files.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    access.log, access.keep_dir = log, str(run_dir / "read_before_write")
    content = {"a.txt": b"removed", "ck/b.pt": b"rotated", "c.txt": b"renamed", "d.txt": b"replaced",
               "never.txt": b"never read"}  # fmt: skip
    for rel, data in content.items():
        (root / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        with io.FileIO(root / "data" / rel, "w") as setup:
            setup.write(data)
    for rel in ("a.txt", "ck/b.pt", "c.txt", "d.txt"):
        Path("data", rel).read_bytes()
    os.remove("data/a.txt")
    assert shutil._use_fd_functions  # (rmtree unlinks each file by name, relative to its directory)
    shutil.rmtree("data/ck")
    os.rename("data/c.txt", "data/c2.txt")
    Path("data/d.tmp").write_bytes(b"new")
    os.replace("data/d.tmp", "data/d.txt")
    os.unlink("data/never.txt")
    os.close(log)
    opened = read_opened(run_dir / "files.jsonl")
    assert opened["as_read"] == {
        f"data/{rel}": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "kept": True}
        for rel, data in content.items() if rel != "never.txt"
    }  # fmt: skip
    for rel in ("a.txt", "ck/b.pt", "c.txt", "d.txt"):
        assert (run_dir / "read_before_write" / "data" / rel).read_bytes() == content[rel]
    assert {"data/c2.txt", "data/d.txt"} <= set(opened["written"])
    assert (root / "data" / "d.txt").read_bytes() == b"new"


def test_a_file_written_outside_the_repository_then_read_is_not_named(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """Defect 12: the run's own file outside the repository (written first, by open or by a writer the
    hook does not see, such as torch.save's) is no outside input; one only read is."""
    access, _ = watched
    own, saved = tmp_path / "own.txt", tmp_path / "model.pt"
    with open(own, "w") as handle:
        handle.write("mine")
    with io.FileIO(saved, "w") as setup:  # torch.save's writer: noted by its hook
        setup.write(b"weights")
    access.note_saved(saved)
    for path in (own, saved):
        with open(path, "rb"):
            pass
    assert list(access.outside) == []
    with open(tmp_path / "outside.txt", "rb"):  # written before the run: an outside input
        pass
    assert list(access.outside) == [str(tmp_path / "outside.txt")]


def test_a_removal_that_fails_leaves_no_second_name_on_the_file_it_kept(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """The kept second name was made before the rename or unlink: when that failed (a missing source,
    EXDEV before shutil.move copies over the file), the keep directory held the user's live file, so a
    later write in place changed the "bytes as read", and the DVC cache took the live file by hardlink
    (and made it read-only). The keep is a private copy then, still the bytes as read."""
    import hashlib

    access, root = watched
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = os.open(run_dir / "files.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    access.log, access.keep_dir = log, str(run_dir / "read_before_write")
    live = root / "data" / "vocab.txt"
    with io.FileIO(live, "w") as setup:
        setup.write(b"as read")
    Path("data/vocab.txt").read_bytes()
    with pytest.raises(FileNotFoundError):
        os.replace("data/missing.tmp", "data/vocab.txt")
    assert os.stat(live).st_nlink == 1
    with io.FileIO(live, "r+") as in_place:  # (what shutil.move's copy does after EXDEV)
        in_place.write(b"rewritten")
    os.close(log)
    kept = run_dir / "read_before_write" / "data" / "vocab.txt"
    assert kept.read_bytes() == b"as read"
    opened = read_opened(run_dir / "files.jsonl")
    assert opened["as_read"]["data/vocab.txt"]["sha256"] == hashlib.sha256(b"as read").hexdigest()


PATHLIB_310 = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from cascade_repro.child.file_access import FileAccess
root, run = Path(sys.argv[2]), Path(sys.argv[3])
(root / "data").mkdir(parents=True)
(root / "data" / "ckpt.pt").write_bytes(b"resumed from")
os.chdir(root)
access = FileAccess(str(root))
access.install()
access.log = os.open(run / "files.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
access.keep_dir = str(run / "kept")
Path("data/ckpt.pt").read_bytes()
Path("data/ckpt.pt").unlink()  # (a checkpoint saved over: make_room unlinks it first)
"""


def test_pathlib_reads_and_removals_are_seen_on_python_3_10(tmp_path: Path) -> None:
    """On Python 3.10 pathlib calls os and io through its own accessor, bound when pathlib is imported:
    Path.read_bytes, Path.open and Path.unlink went around every hook (a resume checkpoint saved over
    kept nothing; reads through pathlib were not inputs). The child runs under whatever Python a
    container has, so the 3.10 accessor is hooked too."""
    import glob
    import pwd
    import shutil
    import subprocess

    pyenv = os.environ.get("PYENV_ROOT") or os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".pyenv")
    found = [shutil.which("python3.10"), *sorted(glob.glob(f"{pyenv}/versions/3.10*/bin/python3.10"))]
    working = [p for p in found if p and not subprocess.run([p, "-c", ""], capture_output=True).returncode]
    if not working:
        pytest.skip("no Python 3.10 interpreter on this machine (pyenv provides one on the CI image)")
    python = working[0]
    root, run = tmp_path / "repo", tmp_path / "run"
    run.mkdir()
    package = str(Path(__file__).resolve().parents[2])
    subprocess.run([python, "-c", PATHLIB_310, package, str(root), str(run)], check=True, timeout=60)
    opened = read_opened(run / "files.jsonl")
    assert opened["read"] == ["data/ckpt.pt"]
    assert opened["as_read"]["data/ckpt.pt"]["kept"] is True
    assert (run / "kept" / "data" / "ckpt.pt").read_bytes() == b"resumed from"


def test_the_files_read_in_a_directory_renamed_away_keep_their_bytes_as_read(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """os.rename (or shutil.move) of a directory after reading files in it kept nothing: the inputs lost
    `ck/a/w.bin` (gone from its path at the run's end) and restore could not give it back."""
    import hashlib

    access, root = watched
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = os.open(run_dir / "files.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    access.log, access.keep_dir = log, str(run_dir / "read_before_write")
    (root / "ck" / "a").mkdir(parents=True)
    with io.FileIO(root / "ck" / "a" / "w.bin", "w") as setup:
        setup.write(b"weights as read")
    Path("ck/a/w.bin").read_bytes()
    os.rename("ck", "ck_old")
    os.close(log)
    opened = read_opened(run_dir / "files.jsonl")
    assert opened["as_read"] == {
        "ck/a/w.bin": {"sha256": hashlib.sha256(b"weights as read").hexdigest(), "size": 15, "kept": True}
    }
    assert (run_dir / "read_before_write" / "ck" / "a" / "w.bin").read_bytes() == b"weights as read"


def test_a_file_read_then_truncated_by_path_keeps_its_bytes_as_read(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """os.truncate(path, n) cut a file the run had read with no open() for writing: its bytes as read
    were lost (a log or a cache the script reads, then empties). A truncate by descriptor follows an
    open for writing, which kept them already; a file never read costs nothing."""
    import hashlib

    access, root = watched
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = os.open(run_dir / "files.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    access.log, access.keep_dir = log, str(run_dir / "read_before_write")
    data = b"the records the run read"
    for name, content in (("cache.bin", data), ("never.bin", b"never read")):
        with io.FileIO(root / "data" / name, "w") as setup:  # (not through the hook: not the run's)
            setup.write(content)
    Path("data/cache.bin").read_bytes()
    os.truncate("data/cache.bin", 3)
    os.truncate(root / "data" / "never.bin", 0)
    os.close(log)
    opened = read_opened(run_dir / "files.jsonl")
    as_read = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "kept": True}
    assert opened["as_read"] == {"data/cache.bin": as_read}
    assert (run_dir / "read_before_write" / "data" / "cache.bin").read_bytes() == data
    assert (root / "data" / "cache.bin").read_bytes() == data[:3]
    assert "data/cache.bin" in opened["written"]


def test_package_metadata_read_outside_the_repository_is_not_named(
    watched: tuple[FileAccess, Path], tmp_path: Path
) -> None:
    """A package installed outside the interpreter's prefix (on PYTHONPATH, a `.pth`'s site directory):
    torch's scan of entry points reads every distribution's metadata there. It is no run's data (it
    was named as a likely cause of a divergence, before the weights' own difference)."""
    import importlib.metadata

    access, _ = watched
    site = tmp_path / "packages"
    for dist, metadata in (("gymnasium-1.4.0.dist-info", "METADATA"), ("old_one.egg-info", "PKG-INFO")):
        (site / dist).mkdir(parents=True)  # written by another process: not the run's own files
        subprocess.run(["sh", "-c", f"printf 'Name: x\\nVersion: 1\\n' > {metadata} && "
                        "printf '[console_scripts]\\nx = x:main\\n' > entry_points.txt"],
                       cwd=site / dist, check=True)  # fmt: skip
    found = [d.metadata["Name"] for d in importlib.metadata.distributions(path=[str(site)])]
    assert found == ["x", "x"]
    with open(site / "gymnasium-1.4.0.dist-info" / "entry_points.txt", "rb"):
        pass
    assert list(access.outside) == []
    with open(tmp_path / "outside.txt", "rb"):  # data beside them still is
        pass
    assert list(access.outside) == [str(tmp_path / "outside.txt")]
