"""`cascade verify` end to end against the number of steps (target: ≤ 2 s at 100k steps, and linear).

For each size, two real runs of a tiny seeded script are recorded with a record every step
(`--trace-budget 0`: the default budget would thin the records of steps this short), then
`cascade verify --no-record` compares them as a user runs it: resolving both runs, reading and
parsing both `trace.jsonl` files, judging step by step. Each verdict must be BITWISE_IDENTICAL over
every step before a time is printed. Beside it, the same runs' traces parsed with `json` alone (the
floor any verifier pays) and the time per step against the recorded step time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

from common import CASCADE, HERE, clean_env, median, scratch_repo, verdict

SIZES = (100, 10_000, 100_000)
REPEATS = 3
TARGET_S = 2.0
EVERY_STEP = ("--trace-budget", "0")  # a record (and the weights) every step: 100k records at 100k steps


def run(argv: list[str], cwd: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=clean_env())
    if done.returncode != expect:
        sys.exit(f"{' '.join(argv[2:])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def diverged_from_the_start(root: object, original: str, steps: int) -> float:
    """`verify` of `original` against a run of as many steps with another learning rate: DIVERGED at
    step 0, so no step is shared and every record of both traces is read."""
    run([*CASCADE, "run", *EVERY_STEP, "train.py", str(steps), "0.2"], root)
    other = json.loads(run([*CASCADE, "ls", "--json", "--limit", "1"], root).stdout)["data"][0]["run_id"]
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        done = run([*CASCADE, "verify", "--no-record", "--json", original, other], root, expect=3)
        times.append(time.perf_counter() - started)
    result = json.loads(done.stdout)["data"]
    if result["verdict"] != "DIVERGED" or result["first_divergence"]["step"] != 0:
        sys.exit(f"another learning rate: {result['verdict']}, expected DIVERGED at step 0")
    return median(times)


def main() -> None:
    root = scratch_repo({"train.py": HERE / "scripts" / "tiny_train.py"})
    try:
        rows = []
        for steps in SIZES:
            ids = []
            for _ in range(2):
                run([*CASCADE, "run", *EVERY_STEP, "train.py", str(steps)], root)
                ids.append(
                    json.loads(run([*CASCADE, "ls", "--json", "--limit", "1"], root).stdout)["data"][0]
                )
            a, b = (r["run_id"] for r in ids)
            times = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                done = run([*CASCADE, "verify", "--no-record", "--json", a, b], root)
                times.append(time.perf_counter() - started)
            result = json.loads(done.stdout)["data"]
            compared = result["steps"]["compared"]
            if result["verdict"] != "BITWISE_IDENTICAL" or compared != steps:
                sys.exit(
                    f"{steps} steps: {result['verdict']} over {compared} steps, expected every step identical"
                )
            trace = next((root / "mlruns").rglob(f"{a}/artifacts/cascade/trace.jsonl"))
            started = time.perf_counter()
            parsed = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
            parse_s = time.perf_counter() - started
            duration = float(ids[0]["duration_s"] or 0)
            rows.append((steps, median(times), parse_s * 2, len(parsed), duration))
        diverged = diverged_from_the_start(root, a, SIZES[-1])
        print(f"{'steps':>8}  {'verify':>8}  {'parse only':>10}  {'per step':>9}  {'run':>7}")
        for steps, seconds, parse_s, _, duration in rows:
            per_step = seconds / steps * 1e6
            print(f"{steps:>8}  {seconds:>7.2f}s  {parse_s:>9.2f}s  {per_step:>7.1f}us  {duration:>6.1f}s")
        small, large = rows[0], rows[-1]
        growth = (large[1] - small[1]) / (large[0] - small[0]) * 1e6
        ok = verdict(large[1], TARGET_S)
        print(f"growth: {growth:.1f} us per extra step (linear if the per-step time settles); "
              f"100k steps: {large[1]:.2f} s (target <= {TARGET_S} s: {ok})")  # fmt: skip
        ok = verdict(diverged, TARGET_S)
        print(f"{SIZES[-1]} steps diverging at step 0 (another learning rate: every step's loss "
              f"compared): {diverged:.2f} s (target <= {TARGET_S} s: {ok})")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
