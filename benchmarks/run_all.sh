#!/usr/bin/env bash
# Every benchmark, each printing its ratio beside the competitor measured in the same run.
set -euo pipefail
cd "$(dirname "$0")"
for bench in bench_packages.py bench_startup.py bench_log_metrics.py bench_trace.py bench_wall.py \
    bench_checkpoints.py bench_restore.py bench_diff.py bench_read_commands.py bench_verify.py \
    bench_docker_restore.py; do
  printf '\n== %s\n' "$bench"
  python "$bench"
done
