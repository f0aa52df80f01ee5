#!/usr/bin/env bash
# Every benchmark, each printing its ratio beside the competitor measured in the same run; the
# figures also go to benchmarks/results.json (run_all.py). Arguments: only these benchmarks.
set -euo pipefail
cd "$(dirname "$0")"
exec python run_all.py "$@"
