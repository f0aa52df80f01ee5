"""Wall time of `cascade run` / bare `python` on the digits example (about 15 s here).

Target (README, Benchmarks): ≤ 1.05 for recording (issue: cascade run); measured with the step trace off and,
beside it, with the trace on (its own target is per step, see bench_trace.py).
"""

from __future__ import annotations

import subprocess
import sys
import time

from common import CASCADE, ROOT, clean_env, median, scratch_repo, verdict

REPEATS = 4


def wall(command: list[str], repo, env) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    subprocess.run(
        command, cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - started


EPOCHS = ("--epochs", "80")  # 3,600 steps: the figures in the README (the example's default is 20)


def main() -> None:
    example = ROOT / "examples" / "digits"
    repo = scratch_repo(
        {"train.py": example / "train.py", "hyperparameters.yaml": example / "hyperparameters.yaml"}
    )
    env = clean_env()
    wall([*CASCADE, "run", "train.py", "--epochs", "1"], repo, env)  # creates the store; warms caches
    commands = {
        "python train.py": [sys.executable, "train.py", *EPOCHS],
        "cascade run --trace-interval 0": [*CASCADE, "run", "--trace-interval", "0", "train.py", *EPOCHS],
        "cascade run (step trace on)": [*CASCADE, "run", "train.py", *EPOCHS],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(REPEATS):  # rotate the order: this machine's speed drifts by ~10% over minutes
        names = list(commands)[i % 3 :] + list(commands)[: i % 3]
        for name in names:
            times[name].append(wall(commands[name], repo, env))
    bare = times["python train.py"]
    # The fastest of N is the figure least disturbed by this machine's drifting speed; the median
    # is printed beside it so the noise is visible.
    for name, values in times.items():
        print(f"{name:32}: best {min(values):.2f} s, median {median(values):.2f} s (of {REPEATS})")
    for name in list(commands)[1:]:
        ours = times[name]
        ratio = min(ours) / min(bare)
        print(
            f"{name:32}: ratio of the best {ratio:.3f}, of the medians {median(ours) / median(bare):.3f}"
            f"  (target <= 1.05 for recording alone: {verdict(ratio, 1.05)})"
        )


if __name__ == "__main__":
    main()
