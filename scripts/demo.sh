#!/usr/bin/env bash
# The main job on embedded defaults: a fresh git project with the digits example, `cascade init`,
# two recorded runs, the run list and record, and a bit-for-bit comparison of the two runs.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
demo="${DEMO_DIR:-$here/.demo/digits}"
export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-cascade demo}" GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-demo@example.com}"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "a fresh project in $demo"
rm -rf "$demo" && mkdir -p "$demo"
cp "$here/examples/digits/train.py" "$here/examples/digits/hyperparameters.yaml" "$demo/"
cd "$demo"
git init -q -b main && git add -A && git commit -qm "digits example"

step "cascade init"
cascade init
git add -A && git commit -qm "cascade init"

step "cascade run train.py (recorded into MLflow at $demo/mlflow.db)"
cascade run train.py

step "cascade run --set optimizer.lr=0.02 train.py --epochs 5"
cascade run --set optimizer.lr=0.02 train.py --epochs 5

step "cascade run train.py again: same code, same seed"
cascade run train.py

step "cascade ls"
cascade ls

latest="$(cascade ls --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["run_id"])')"
step "cascade show ${latest:0:8}"
cascade show "${latest:0:8}"

step "the two default runs, compared bit for bit"
cascade ls --json | python3 -c '
import json, struct, sys
runs = [r for r in json.load(sys.stdin)["data"] if "train_loss" in r["metrics"]]
last_epoch = max(r["metrics"].get("epoch", 0) for r in runs)
a, b = [r for r in runs if r["metrics"].get("epoch") == last_epoch][:2]
bits = lambda v: struct.pack("<d", v).hex()
same = all(bits(a["metrics"][k]) == bits(b["metrics"][k]) for k in a["metrics"])
print("runs", a["run_id"][:8], "and", b["run_id"][:8], "final metrics:", "bit-identical" if same else "DIFFERENT")
sys.exit(0 if same else 3)
'
step "done: browse it with  (cd $demo && mlflow ui)"
