"""Inputs that git and DVC do not track (a dataset of many GB, nanoGPT's ignored train.bin), hashed
once and then known by their stat (cascade_repro/file_hashes.py), in one run (a 512 MiB file here):

1. `cascade check RUN` end to end, the input's sha256 kept since the run / the same with the kept
   hashes removed before each call (what every check and restore did before): reported, with the
   seconds of each;
2. the hash alone: `sha256sum` of the file as a new process (the competitor: what verifying it costs
   without a kept hash) beside cascade reading the kept one.

Sanity checks before any figure: the run recorded the file's sha256 as `sha256sum` gives it, check
says BITWISE_REPRODUCIBLE, and after one byte is changed with its size and mtime put back, check says
NOT_RUNNABLE (the kept hash is never used for other bytes).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import CASCADE, ROOT, median, scratch_repo, timed

SIZE_MB = 512
REPEATS = 3
READS = "import sys\nwith open('data/train.bin', 'rb') as f:\n    while f.read(1 << 24):\n        pass\n"


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "reads.py"
        script.write_text(READS)
        root = scratch_repo({"reads.py": script})
    try:
        measure(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(root: Path) -> None:
    (root / ".gitignore").write_text((root / ".gitignore").read_text() + "data/\n")
    data = root / "data" / "train.bin"
    data.parent.mkdir()
    with open(data, "wb") as out:
        for _ in range(SIZE_MB):
            out.write(os.urandom(1 << 20))
    time.sleep(1.2)  # (a file changed within the file system's last tick is hashed every time)
    timed([*CASCADE, "run", "reads.py"], root)
    listed = json.loads(timed([*CASCADE, "ls", "--json"], root)[1])["data"]
    run_id = listed[0]["run_id"]
    record = json.loads(timed([*CASCADE, "show", run_id, "--json"], root)[1])["data"]["manifest"]
    recorded = {i["path"]: i["sha256"] for i in record["inputs"]}
    sha256sum = [timed(["sha256sum", str(data)], root) for _ in range(REPEATS)]
    if recorded.get("data/train.bin") != sha256sum[0][1].split()[0]:
        sys.exit(f"the run recorded {recorded}, sha256sum says {sha256sum[0][1]}")

    check = [*CASCADE, "check", run_id, "--json"]
    kept = []
    for _ in range(REPEATS):
        took, out = timed(check, root)
        if json.loads(out)["data"]["verdict"] != "BITWISE_REPRODUCIBLE":
            sys.exit(f"check said {out}")
        kept.append(took)
    hashes = root / ".cascade" / "file_hashes.json"
    saved = hashes.read_bytes()
    rehashed = []
    for _ in range(REPEATS):
        hashes.unlink()
        rehashed.append(timed(check, root)[0])
    hashes.write_bytes(saved)

    before = data.stat()
    with open(data, "r+b") as handle:
        handle.seek(SIZE_MB << 19)
        byte = handle.read(1)
        handle.seek(SIZE_MB << 19)
        handle.write(bytes([byte[0] ^ 1]))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    out = timed(check, root, expect=1)[1]
    if json.loads(out)["data"]["verdict"] != "NOT_RUNNABLE":
        sys.exit(f"check of a changed input said {out}")

    k, r, s = median(kept), median(rehashed), median([t for t, _ in sha256sum])
    print(f"input file                      : {SIZE_MB} MiB, ignored by git (root {ROOT.name})")
    print(f"cascade check, sha256 kept      : {k:.2f} s")
    print(f"cascade check, re-hashing       : {r:.2f} s (what each check and restore did before)")
    print(f"sha256sum of the file           : {s:.2f} s (competitor: verifying it without a kept hash)")
    print(f"check kept / check re-hashing   : ratio {k / r:.3f} (reported)")
    print(f"check kept - re-hashing, saved  : {r - k:.2f} s a call, {(r - k) / SIZE_MB * 1024:.1f} s per GiB")


if __name__ == "__main__":
    main()
