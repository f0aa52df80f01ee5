"""Time from `cascade run` to the script's first line, minus the same for bare `python`.

Target (README, Benchmarks): ≤ 0.3 s. Capture and the MLflow run open concurrently with the child.
"""

from __future__ import annotations

import subprocess
import sys
import time

from common import CASCADE, HERE, clean_env, median, scratch_repo, verdict

REPEATS = 5


def first_line_delay(command: list[str], repo, env) -> float:  # type: ignore[no-untyped-def]
    started = time.time()
    subprocess.run(
        command, cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return float((repo / "first_line.json").read_text()) - started


def main() -> None:
    repo = scratch_repo({"first_line.py": HERE / "scripts" / "first_line.py"})
    env = clean_env()
    subprocess.run(
        [*CASCADE, "run", "first_line.py"], cwd=repo, env=env, check=True, capture_output=True
    )  # warm
    bare, ours = [], []
    for _ in range(REPEATS):
        bare.append(first_line_delay([sys.executable, "first_line.py"], repo, env))
        ours.append(first_line_delay([*CASCADE, "run", "first_line.py"], repo, env))
    extra = median(ours) - median(bare)
    print(f"bare python to first line   : {median(bare) * 1e3:.0f} ms (median of {REPEATS})")
    print(f"cascade run to first line   : {median(ours) * 1e3:.0f} ms")
    print(f"cascade's extra start time  : {extra:.3f} s  (target <= 0.3 s: {verdict(extra, 0.3)})")


if __name__ == "__main__":
    main()
