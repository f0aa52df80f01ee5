"""Checkpoints into the DVC cache, three figures in one run (a 256 MiB torch.save on this machine):

1. commit into the DVC cache (one md5 pass + a reflink, else a copy, the default; or a hardlink with
   `checkpoint_link: hardlink`; + DVC state entry) / `md5sum` of the same file: target <= 1.2,
   beside `dvc add` of the same bytes (which hashes, copies, writes a .dvc).
   Both are started the same way, as a new process (interpreter start, imports, the repository
   opened); the in-process figure (the parent of `cascade run` has the repository open) beside it;
2. bytes read back from storage after the checkpoint was written / its size (/proc/<pid>/io
   read_bytes of the hashing process): target <= 0.01. Measured with the page cache dropped
   (`echo 1 > /proc/sys/vm/drop_caches`, root only), which is what a checkpoint larger than the
   free memory meets; without root the page cache hides the re-read and the figure says so;
3. training step time while a checkpoint is being committed by another process / without: reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median

SIZE_MB = 256
COMMIT = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from cascade_repro.store.dvc_store import Cache
cache = Cache(Path({repo!r})); cache.repo()
def read_bytes():
    return int(next(l for l in open('/proc/self/io') if l.startswith('read_bytes')).split()[1])
before = read_bytes(); started = time.perf_counter()
stored = cache.add(Path({path!r}), hardlink={hardlink})
print(time.perf_counter() - started, read_bytes() - before, stored.link)
"""


def write_checkpoint(path: Path) -> None:
    code = f"import torch; torch.save(torch.randn({SIZE_MB} * 262144), {str(path)!r})"
    subprocess.run([sys.executable, "-c", code], check=True)


def dvc_repo(base: Path, name: str) -> Path:
    repo = base / name
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    return repo


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def commit_in_subprocess(repo: Path, path: Path, hardlink: bool = False) -> tuple[float, float, int, str]:
    """(the whole process's wall time, the commit's own, bytes it read, how the object was placed)."""
    code = COMMIT.format(root=str(ROOT), repo=str(repo), path=str(path), hardlink=hardlink)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    return time.perf_counter() - started, float(out[0]), int(out[1]), out[2]


def drop_page_cache() -> bool:
    """Written pages out and the clean ones dropped, so a re-read shows in read_bytes (root only)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True


def step_times(seconds: float) -> list[float]:
    code = (
        "import time, torch\n"
        "torch.manual_seed(0); m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),"
        " torch.nn.Linear(1024, 512)); o = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "x = torch.randn(64, 512)\n"
        f"end = time.perf_counter() + {seconds}; times = []\n"
        "while time.perf_counter() < end:\n"
        "    t = time.perf_counter(); o.zero_grad(); m(x).pow(2).mean().backward(); o.step()\n"
        "    times.append(time.perf_counter() - t)\n"
        "print(' '.join(map(str, times)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [float(v) for v in out.split()]


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="cascade-bench-ckpt-"))
    try:
        ours_repo, dvc_add_repo = dvc_repo(base, "ours"), dvc_repo(base, "dvc-add")
        ratios, inside, linked, dvc_ratios, read_ratios, links = [], [], [], [], [], set()
        dropped = True
        for index in range(3):
            ours = ours_repo / f"ckpt-{index}.pt"
            write_checkpoint(ours)
            dropped = drop_page_cache() and dropped
            _, _, read_back, link = commit_in_subprocess(ours_repo, ours)  # cold: what it reads back
            links.add(link)
            read_ratios.append(read_back / ours.stat().st_size)
            md5sum_s = timed(["md5sum", str(ours)], base)  # warm now: both sides below hash from memory
            theirs = dvc_add_repo / f"ckpt-{index}.pt"
            shutil.copyfile(ours, theirs)
            dvc_s = timed([sys.executable, "-m", "dvc", "add", "-q", theirs.name], dvc_add_repo)
            again = ours_repo / f"ckpt-{index}-copy.pt"  # new bytes to hash, warm as dvc's copy is
            shutil.copyfile(ours, again)
            process_s, commit_s, _, _ = commit_in_subprocess(ours_repo, again)
            ratios.append(process_s / md5sum_s)
            inside.append(commit_s / md5sum_s)
            link_me = ours_repo / f"ckpt-{index}-linked.pt"
            shutil.copyfile(ours, link_me)
            linked.append(commit_in_subprocess(ours_repo, link_me, hardlink=True)[1] / md5sum_s)
            dvc_ratios.append(dvc_s / md5sum_s)
        how = "page cache dropped" if dropped else "page cache NOT dropped (not root): re-reads hidden"
        print(f"checkpoint: {SIZE_MB} MiB, placed by {', '.join(sorted(links))}")
        print(f"commit as a new process / md5sum   : {median(ratios):.2f}  (target <= 1.2; median of 3)")
        print(f"  the commit alone (repo open)     : {median(inside):.2f}  (what a run's parent pays)")
        print(f"  the same by hardlink             : {median(linked):.2f}  (checkpoint_link: hardlink)")
        print(f"dvc add as a new process / md5sum  : {median(dvc_ratios):.2f}  (the competitor)")
        print(f"bytes read back / checkpoint size  : {max(read_ratios):.4f}  (target <= 0.01; worst of 3)")
        print(f"  measured with                    : {how}")

        quiet = step_times(4.0)
        busy_file = ours_repo / "busy.pt"
        write_checkpoint(busy_file)
        code = COMMIT.format(root=str(ROOT), repo=str(ours_repo), path=str(busy_file), hardlink=False)
        committing = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
        busy = step_times(1.5)
        committing.wait()
        ratio = median(busy) / median(quiet)
        detail = f"{median(busy) * 1e3:.2f} ms vs {median(quiet) * 1e3:.2f} ms; {os.cpu_count()} cores"
        print(f"step time while committing / without: {ratio:.2f}  ({detail})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
