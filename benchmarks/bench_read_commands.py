"""Read commands at interactive speed (target ≤ 0.5 s each on the embedded store): `cascade ls`,
`show`, `verify` (recording its verdict, and with `--no-record`) and `diff` end to end as a user runs
them, beside MLflow's own CLI listing the same runs (`mlflow runs list`) and a bare
`python -c pass`, measured in the same run.

Two real runs of a small script (1,000 steps each) are recorded first; each command is checked to
have answered (exit code and output) before any time is reported, and the recorded verdict to be on
the later run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
import time

from common import CASCADE, HERE, clean_env, median, scratch_repo, timed, verdict

REPEATS = 5
STEPS = 1000
TARGET_S = 0.5


def main() -> None:
    root = scratch_repo({"train.py": HERE / "scripts" / "tiny_train.py"})
    try:
        for args in (["--tag", "v1", "train.py", str(STEPS), "0.1"], ["train.py", str(STEPS), "0.05"]):
            timed([*CASCADE, "run", *args], root)
        listed = json.loads(timed([*CASCADE, "ls", "--json"], root)[1])["data"]
        if len(listed) != 2:
            sys.exit(f"cascade ls listed {len(listed)} runs, expected the 2 just recorded")
        other = next(r["run_id"] for r in listed if r["version"] != "v1")
        experiment = json.loads(timed([*CASCADE, "show", "v1", "--json"], root)[1])["data"]["manifest"]
        mlflow_ls = [sys.executable, "-m", "mlflow", "runs", "list", "--experiment-id", "1"]
        env_uri = f"sqlite:///{root / 'mlflow.db'}"
        commands = {
            "cascade ls": ([*CASCADE, "ls"], 0),
            "cascade show v1": ([*CASCADE, "show", "v1"], 0),
            "cascade verify": ([*CASCADE, "verify", "v1", other], 3),  # lr differs; the verdict recorded
            "cascade verify --no-record": ([*CASCADE, "verify", "--no-record", "v1", other], 3),
            "cascade diff": ([*CASCADE, "diff", "v1", other], 0),
        }
        results = {name: median([timed(argv, root, code)[0] for _ in range(REPEATS)])
                    for name, (argv, code) in commands.items()}  # fmt: skip
        with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as db:  # where MLflow reads it
            recorded = db.execute("SELECT value FROM tags WHERE run_uuid = ? AND key = 'cascade.verdict'",
                                  (other,)).fetchall()  # fmt: skip
        if recorded != [("DIVERGED",)]:
            sys.exit(f"cascade verify did not record its verdict on {other}: {recorded}")
        started = time.perf_counter()
        for _ in range(REPEATS):
            done = subprocess.run(mlflow_ls, cwd=root, capture_output=True, text=True,
                                  env={**clean_env(), "MLFLOW_TRACKING_URI": env_uri})  # fmt: skip
            if done.returncode != 0 or other not in done.stdout:
                sys.exit(f"mlflow runs list did not list the runs:\n{done.stdout}\n{done.stderr}")
        mlflow_s = (time.perf_counter() - started) / REPEATS
        bare = median([timed([sys.executable, "-c", "pass"], root)[0] for _ in range(REPEATS)])
        print(f"experiment {experiment.get('experiment')}: 2 runs; medians of {REPEATS}")
        print(f"{'python -c pass':28}: {bare:.2f} s")
        print(f"{'mlflow runs list (MLflow)':28}: {mlflow_s:.2f} s")
        for name, seconds in results.items():
            print(f"{name:28}: {seconds:.2f} s  (target <= {TARGET_S} s: {verdict(seconds, TARGET_S)}; "
                  f"{mlflow_s / seconds:.1f}x faster than mlflow runs list)")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
