"""Per-step metric logging: cascade.log_metrics vs mlflow.log_metrics, on a small CPU model.

Targets (README, Benchmarks): step time with logging / without ≤ 1.03; one log_metrics call (5 scalars)
≤ 10 µs; MLflow requests for N points = ceil(N / 1000).

The step trace is off here (`--trace-interval 0`): "without" is a bare step, so the ratio is the cost
of logging alone (the trace has its own benchmark, bench_trace.py). The points the store holds are
counted and must be every point logged before any ratio is printed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from common import CASCADE, HERE, clean_env, median, scratch_repo, verdict


def main() -> None:
    repo = scratch_repo({"steps.py": HERE / "scripts" / "steps.py"})
    env = clean_env()
    subprocess.run(
        [*CASCADE, "run", "--trace-interval", "0", "steps.py", "cascade.json", "cascade"],
        cwd=repo,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    mlflow_env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'direct.db'}"}
    subprocess.run(
        [sys.executable, "steps.py", "mlflow.json", "mlflow"],
        cwd=repo,
        env=mlflow_env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    ours = json.loads((repo / "cascade.json").read_text())
    theirs = json.loads((repo / "mlflow.json").read_text())
    ratio = median(ours["times"]["on"]) / median(ours["times"]["off"])
    mlflow_ratio = median(theirs["times"]["on"]) / median(theirs["times"]["off"])

    listed = subprocess.run(
        [*CASCADE, "ls", "--json"], cwd=repo, env=env, check=True, capture_output=True, text=True
    )
    run_id = json.loads(listed.stdout)["data"][0]["run_id"]
    shown = subprocess.run(
        [*CASCADE, "show", run_id, "--json"], cwd=repo, env=env, check=True, capture_output=True, text=True
    )
    metrics = json.loads(shown.stdout)["data"]["manifest"]["metrics"]
    points, requests = metrics["points"], metrics["requests"]
    logged = (ours["logged_steps"] // 2) * 5 + 20000 * 5  # the logging blocks' steps, then the calls
    expected = logged + len(metrics.get("resources") or {})  # and cascade's own (peak memory) at the end
    if points != expected or requests != math.ceil(points / 1000):
        sys.exit(f"the store holds {points} points in {requests} requests; {expected} were logged")

    print(f"step time (off)                 : {median(ours['times']['off']) * 1e3:.3f} ms")
    print(f"cascade log_metrics every step  : ratio {ratio:.4f}  (target <= 1.03: {verdict(ratio, 1.03)})")
    print(f"mlflow.log_metrics every step   : ratio {mlflow_ratio:.4f}  (the competitor, same run)")
    print(
        f"one log_metrics call, 5 scalars : {ours['enqueue_us']:.2f} us  (target <= 10: "
        f"{verdict(ours['enqueue_us'], 10)})"
    )
    print(f"MLflow requests for {points} points: {requests} (ceil(N/1000) = {math.ceil(points / 1000)})")


if __name__ == "__main__":
    main()
