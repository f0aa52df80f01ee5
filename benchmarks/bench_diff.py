"""`cascade diff` of two runs with 500 packages and 200 params: the diff itself / fetching the two
runs' data with the MLflow client (get_run + the record artifact), measured in the same run.

No numeric target: the issue asks for the figure (the diff should be negligible beside the fetch).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median

sys.path.insert(0, str(ROOT))

from cascade_repro.diff import diff_records  # noqa: E402

REPEATS = 5


def record(run_id: str, shift: int) -> dict[str, object]:
    packages = {f"package-{i}": {"version": f"1.{i}.{(i + shift) % 7}"} for i in range(500)}
    params = {f"group{i // 20}": {f"p{i}": i * 0.5 + (shift if i % 50 == 0 else 0)} for i in range(200)}
    values: dict[str, dict[str, float]] = {}
    for group, items in params.items():
        values.setdefault(group, {}).update(items)
    return {
        "schema": "cascade.run/1", "run_id": run_id, "experiment": "bench",
        "params": {"values": values, "seed": 0}, "python": {"version": "3.11.7", "packages": packages},
        "torch": {"version": "2.13.0+cpu"}, "git": {"commit": "c" * 40}, "command": {"script": "t.py"},
        "environment": {}, "hardware": {"cpu": {"model": "x86_64"}}, "metrics": {},
    }  # fmt: skip


def main() -> None:
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow import MlflowClient

    base = Path(tempfile.mkdtemp(prefix="cascade-bench-diff-"))
    try:
        client = MlflowClient(tracking_uri=f"sqlite:///{base / 'mlflow.db'}")
        experiment = client.create_experiment("bench", artifact_location=(base / "mlruns").as_uri())
        ids = []
        for shift in (0, 1):
            run = client.create_run(experiment)
            data = record(run.info.run_id, shift)
            values = data["params"]["values"]  # type: ignore[index]
            flat = {f"{g}.{k}": v for g, items in values.items() for k, v in items.items()}
            from mlflow.entities import Param

            params = [Param(k, str(v)) for k, v in flat.items()]
            for start in range(0, len(params), 100):
                client.log_batch(run.info.run_id, params=params[start : start + 100])
            client.log_text(run.info.run_id, json.dumps(data), "cascade/run.json")
            ids.append(run.info.run_id)

        fetch_times, diff_times = [], []
        for _ in range(REPEATS):
            started = time.perf_counter()
            records = []
            for run_id in ids:
                client.get_run(run_id)
                local = client.download_artifacts(run_id, "cascade/run.json", str(base / "dl"))
                records.append(json.loads(Path(local).read_text()))
            fetch_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            result = diff_records(records[0], records[1])
            diff_times.append(time.perf_counter() - started)
        changes = sum(len(s.changes) for s in result.sections)
        fetch_ms, diff_ms = median(fetch_times) * 1e3, median(diff_times) * 1e3
        print(f"fetch of the two runs (get_run + record) : {fetch_ms:.1f} ms (median of {REPEATS})")
        print(f"diff of the two records                  : {diff_ms:.2f} ms ({changes} changes)")
        print(f"diff / fetch                             : {median(diff_times) / median(fetch_times):.3f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
