"""Per-step metric logging to a tracking server: cascade.log_metrics vs mlflow.log_metrics over REST.

Target (issue 15): against `mlflow server --serve-artifacts`, the step time with cascade's logging
/ without ≤ 1.03 (points are spooled and sent in batches of 1000 from the parent); MLflow's own
client, one REST request per call in the training process, is its own figure, measured here on the
same server and the same loop (benchmarks/scripts/steps.py: blocks with and without logging,
interleaved). The points the server holds are counted before any ratio is printed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from common import CASCADE, HERE, clean_env, median, scratch_repo, start_server, stop_server, verdict


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="cascade-bench-server-"))
    url, server = start_server(workdir)
    try:
        repo = scratch_repo({"steps.py": HERE / "scripts" / "steps.py"})
        env = {**clean_env(), "MLFLOW_TRACKING_URI": url}
        subprocess.run([*CASCADE, "run", "--trace-interval", "0", "steps.py", "cascade.json", "cascade"],
                       cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        subprocess.run([sys.executable, "steps.py", "mlflow.json", "mlflow"], cwd=repo, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        ours = json.loads((repo / "cascade.json").read_text())
        theirs = json.loads((repo / "mlflow.json").read_text())

        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=url)
        listed = subprocess.run([*CASCADE, "ls", "--json"], cwd=repo, env=env, check=True,
                                capture_output=True, text=True)  # fmt: skip
        run_id = json.loads(listed.stdout)["data"][0]["run_id"]
        logged = ours["logged_steps"] // 2  # the logging blocks' steps
        stored = len(client.get_metric_history(run_id, "loss"))
        extra = len(client.get_metric_history(run_id, "a"))
        if stored != logged or extra != 20000:
            sys.exit(f"the server holds {stored} loss points of {logged}, and {extra} of the 20000 calls")
        shown = subprocess.run([*CASCADE, "show", run_id, "--json"], cwd=repo, env=env, check=True,
                               capture_output=True, text=True)  # fmt: skip
        metrics = json.loads(shown.stdout)["data"]["manifest"]["metrics"]
    finally:
        stop_server(server)

    ratio = median(ours["times"]["on"]) / median(ours["times"]["off"])
    mlflow_ratio = median(theirs["times"]["on"]) / median(theirs["times"]["off"])
    print(f"step time (off)                      : {median(ours['times']['off']) * 1e3:.3f} ms")
    print(f"cascade log_metrics to the server    : ratio {ratio:.4f}  "
          f"(target <= 1.03: {verdict(ratio, 1.03)})")  # fmt: skip
    print(f"mlflow.log_metrics over REST         : ratio {mlflow_ratio:.4f}  (the competitor, same server)")
    points, requests = metrics["points"], metrics["requests"]
    print(f"requests for cascade's {points} points: {requests} (ceil(N/1000) = {math.ceil(points / 1000)}); "
          f"MLflow's client: one per log_metrics call ({logged} in its run)")  # fmt: skip


if __name__ == "__main__":
    main()
