"""Package capture (what `cascade run` records) vs `pip freeze`, on this environment.

Target (README, Benchmarks): ≤ 0.1.
"""

from __future__ import annotations

import subprocess
import sys
import time

from common import median, verdict

from cascade_repro.capture.packages import capture_packages

REPEATS = 5


def main() -> None:
    ours, theirs = [], []
    for _ in range(REPEATS):
        started = time.perf_counter()
        packages = capture_packages()
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        frozen = subprocess.run(
            [sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True
        )
        theirs.append(time.perf_counter() - started)
    ratio = median(ours) / median(theirs)
    lines = [line for line in frozen.stdout.splitlines() if line and not line.startswith("#")]
    print(f"cascade capture : {median(ours) * 1e3:.1f} ms for {len(packages)} packages (median of {REPEATS})")
    print(f"pip freeze      : {median(theirs) * 1e3:.1f} ms for {len(lines)} packages")
    print(f"ratio           : {ratio:.3f}  (target <= 0.1: {verdict(ratio, 0.1)})")


if __name__ == "__main__":
    main()
