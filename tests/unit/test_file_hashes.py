"""A file's sha256 kept by its stat (file_hashes.py): read once while the file stays as it was, read
again after any change, the old mtime put back included."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from cascade_repro import file_hashes
from cascade_repro.file_hashes import RACY_S, FileHashes
from cascade_repro.settings import ProjectPaths

SIZE = 8 << 20


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the files file_hashes has read through (its real reader, counted)."""
    counted: list[int] = []
    real = file_hashes._read

    def counting(handle: Any) -> tuple[str, int]:
        digest, size = real(handle)
        counted.append(size)
        return digest, size

    monkeypatch.setattr(file_hashes, "_read", counting)
    return counted


def test_an_unchanged_file_is_read_once_and_any_write_is_seen(tmp_path: Path, reads: list[int]) -> None:
    data = tmp_path / "train.bin"
    data.write_bytes(os.urandom(SIZE))
    time.sleep(RACY_S + 0.1)  # older than the file system's clock could blur
    hashes = FileHashes(tmp_path)
    digest = hashes.sha256(data)
    assert digest == hashlib.sha256(data.read_bytes()).hexdigest() and reads == [SIZE]
    assert hashes.sha256(data) == digest and reads == [SIZE]
    hashes.save()
    assert FileHashes(tmp_path).sha256(data) == digest and reads == [SIZE]  # the next command: kept
    assert str(data.resolve()) in ProjectPaths(tmp_path).file_hashes.read_text()

    # One byte changed, the size and the old mtime put back: its ctime says it changed.
    stat = data.stat()
    with open(data, "r+b") as handle:
        handle.seek(SIZE // 2)
        handle.write(bytes([data.read_bytes()[SIZE // 2] ^ 1]))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = FileHashes(tmp_path).sha256(data)
    assert changed == hashlib.sha256(data.read_bytes()).hexdigest() != digest and reads == [SIZE, SIZE]


def test_a_file_changed_within_the_clocks_blur_is_not_kept(
    tmp_path: Path, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "fresh.bin"
    data.write_bytes(b"x" * SIZE)
    # hashed a moment after its last change, however long this machine took to get here
    changed_ns = data.stat().st_ctime_ns
    monkeypatch.setattr(file_hashes.time, "time_ns", lambda: changed_ns + int(RACY_S * 1e9) // 2)
    hashes = FileHashes(tmp_path)
    first, second = hashes.sha256(data), hashes.sha256(data)
    assert first == second == hashlib.sha256(b"x" * SIZE).hexdigest() and reads == [SIZE, SIZE]
    hashes.save()
    assert not ProjectPaths(tmp_path).file_hashes.exists()


@pytest.mark.parametrize("kept", ['{"/x": [1, 2], "/y": "z"}', "[" * 200_000, "not json", None])
def test_a_malformed_or_strange_file_of_hashes_is_an_empty_one(tmp_path: Path, kept: str | None) -> None:
    path = ProjectPaths(tmp_path).file_hashes
    path.parent.mkdir()
    if kept is None:
        path.symlink_to("/dev/zero")  # never read whole
    else:
        path.write_text(kept)
    data = tmp_path / "data.bin"
    data.write_bytes(b"tokens")
    assert FileHashes(tmp_path).sha256(data) == hashlib.sha256(b"tokens").hexdigest()


def test_the_hashes_used_last_are_kept_when_the_oldest_go(
    tmp_path: Path, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left from the last stop: a hash read from the file (a hit) did not count as used, so past
    MAX_ENTRIES the dataset every run reads went first, and was read again at the next run."""
    monkeypatch.setattr(file_hashes, "MAX_ENTRIES", 2)
    files = []
    for name in ("dataset.bin", "old.bin", "new.bin"):
        files.append(tmp_path / name)
        files[-1].write_bytes(os.urandom(SIZE))
    time.sleep(RACY_S + 0.1)
    first = FileHashes(tmp_path)
    first.sha256(files[0])
    first.sha256(files[1])
    first.save()
    again = FileHashes(tmp_path)
    again.sha256(files[0])  # kept: used again
    again.sha256(files[2])
    again.save()
    kept = ProjectPaths(tmp_path).file_hashes.read_text()
    assert str(files[0].resolve()) in kept and str(files[2].resolve()) in kept
    assert str(files[1].resolve()) not in kept and reads == [SIZE, SIZE, SIZE]
