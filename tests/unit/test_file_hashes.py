"""A file's sha256 kept by its stat (file_hashes.py): read once while the file stays as it was, read
again after any change, the old mtime put back included."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from cascade_repro.file_hashes import RACY_S, FileHashes
from cascade_repro.settings import ProjectPaths
from tests.plugin import bytes_read_so_far

SIZE = 8 << 20


def _hashed(hashes: FileHashes, path: Path) -> tuple[str, int]:
    """(the sha256 it gave, the bytes read to give it)"""
    before = bytes_read_so_far()
    digest = hashes.sha256(path)
    return digest, bytes_read_so_far() - before


def test_an_unchanged_file_is_read_once_and_any_write_is_seen(tmp_path: Path) -> None:
    data = tmp_path / "train.bin"
    data.write_bytes(os.urandom(SIZE))
    time.sleep(RACY_S + 0.1)  # older than the file system's clock could blur
    hashes = FileHashes(tmp_path)
    digest, read = _hashed(hashes, data)
    assert digest == hashlib.sha256(data.read_bytes()).hexdigest() and read >= SIZE
    again, read = _hashed(hashes, data)
    assert again == digest and read < SIZE // 100
    hashes.save()
    later, read = _hashed(FileHashes(tmp_path), data)  # the next command: from the file of hashes
    assert later == digest and read < SIZE // 100
    assert str(data.resolve()) in ProjectPaths(tmp_path).file_hashes.read_text()

    # One byte changed, the size and the old mtime put back: its ctime says it changed.
    stat = data.stat()
    with open(data, "r+b") as handle:
        handle.seek(SIZE // 2)
        handle.write(bytes([data.read_bytes()[SIZE // 2] ^ 1]))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed, read = _hashed(FileHashes(tmp_path), data)
    assert changed == hashlib.sha256(data.read_bytes()).hexdigest() != digest and read >= SIZE


def test_a_file_just_written_is_not_kept_and_a_malformed_file_of_hashes_is_empty(tmp_path: Path) -> None:
    kept = ProjectPaths(tmp_path).file_hashes
    kept.parent.mkdir()
    kept.write_text('{"/x": [1, 2], "/y": "z"}')
    data = tmp_path / "fresh.bin"
    data.write_bytes(b"x" * SIZE)
    hashes = FileHashes(tmp_path)
    first, _ = _hashed(hashes, data)
    second, read = _hashed(hashes, data)  # it may still change within the same tick of the clock
    assert first == second == hashlib.sha256(b"x" * SIZE).hexdigest() and read >= SIZE
    hashes.save()
    assert kept.read_text() == '{"/x": [1, 2], "/y": "z"}'  # nothing added: left as it was
