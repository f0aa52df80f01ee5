"""Every benchmark in turn, each printing its figures beside the competitor measured in the same run;
then benchmarks/results.json (ignored by git): per benchmark its exit code, wall time and the lines it
printed, so two machines or two commits can be compared. Exits non-zero if any benchmark failed its
own sanity checks."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "bench_packages.py", "bench_startup.py", "bench_log_metrics.py", "bench_trace.py", "bench_trace_floor.py",
    "bench_wall.py",
    "bench_checkpoints.py", "bench_restore.py", "bench_diff.py", "bench_read_commands.py",
    "bench_verify.py", "bench_replay.py", "bench_docker_restore.py", "bench_server_logging.py",
    "bench_second_clone_restore.py", "bench_device_fingerprint.py",
)  # fmt: skip


def main() -> int:
    wanted = sys.argv[1:] or BENCHMARKS
    results: dict[str, dict[str, object]] = {}
    for name in wanted:
        print(f"\n== {name}", flush=True)
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, name], cwd=HERE, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip("\n"))
        code = process.wait()
        results[name] = {
            "exit_code": code,
            "seconds": round(time.perf_counter() - started, 1),
            "lines": lines,
        }
    summary = {
        "schema": "cascade.bench/1",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                                 text=True).stdout.strip(),
        "benchmarks": results,
    }  # fmt: skip
    (HERE / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    failed = [name for name, result in results.items() if result["exit_code"] != 0]
    print(f"\nsummary: benchmarks/results.json; {len(results) - len(failed)} ran, failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
