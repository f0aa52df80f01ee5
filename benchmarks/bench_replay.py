"""`cascade verify --replay` pinning a divergence the trace only bracketed, against re-running those steps.

Two runs of a seeded MLP (1,075 steps); the second writes one ulp into a weight after step 1,050.
Both are recorded with a trace budget so small that after step 1 the weights are read every 1,024th
step only (and at the last): `verify` brackets the divergence within the 50 steps 1,025-1,074.
`verify --replay` re-runs both runs with every facet traced and the bracket's tensors saved, pins
step 1,050 and measures it. The competitor is re-running those steps with cascade by hand:
`cascade restore RUN --steps 1075` for both runs (restored and verified, the recorded trace budget).
Beside it, the bare script twice (no cascade at all). Target: replay ≤ 1.2 × re-running the steps.

The replay's verdict must pin step 1,050 with the one-ulp difference measured, or no ratio is printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from common import CASCADE, HERE, clean_env, median, scratch_repo, verdict

STEPS, PERTURBED = 1075, 1050
BRACKET = [1025, 1074]
REPEATS = 2
TARGET = 1.2


def run(argv: list[str], cwd: object, expect: int = 0, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**clean_env(), **(env or {})})
    if done.returncode != expect:
        sys.exit(f"{' '.join(argv[2:])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done.stdout


def record(root: object, env: dict[str, str] | None = None) -> str:
    run([*CASCADE, "run", "--trace-budget", "1e-9", "train.py", str(STEPS)], root, env=env)
    return str(json.loads(run([*CASCADE, "ls", "--json", "--limit", "1"], root))["data"][0]["run_id"])


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    root = scratch_repo({"train.py": HERE / "scripts" / "perturbed_train.py"})
    a = record(root)
    b = record(root, {"PERTURB_AT_STEP": str(PERTURBED)})
    bracketed = json.loads(run([*CASCADE, "verify", "--no-record", "--json", a, b], root, expect=3))["data"]
    if bracketed["first_divergence"]["bracket"] != BRACKET:
        sys.exit(f"the traces bracket {bracketed['first_divergence']['bracket']}, expected {BRACKET}")

    replays, by_hand, bare = [], [], []
    result: dict = {}
    for _ in range(REPEATS):

        def replay() -> None:
            argv = [*CASCADE, "verify", "--no-record", "--replay", "--json", a, b]
            result.update(json.loads(run(argv, root, expect=3))["data"])

        def restore_both() -> None:
            for run_id in (a, b):
                argv = [*CASCADE, "restore", run_id, "--steps", str(STEPS), "--json"]
                restored = json.loads(run(argv, root))
                if restored["data"]["verdict"]["verdict"] != "BITWISE_IDENTICAL":
                    sys.exit(f"restore of {run_id[:12]}: {restored['data']['verdict']['summary']}")

        def bare_twice() -> None:
            for env in ({}, {"PERTURB_AT_STEP": str(PERTURBED)}):
                run([sys.executable, "train.py", str(STEPS)], root, env=env)

        replays.append(timed(replay))
        by_hand.append(timed(restore_both))
        bare.append(timed(bare_twice))
        first = result["first_divergence"]
        pinned = result["replay"]["pinned"]
        if first["step"] != PERTURBED or pinned != {"step": PERTURBED, "bracket": BRACKET}:
            sys.exit(f"replay pinned {first['step']} ({result['replay']}), expected step {PERTURBED}")
        magnitude = first["magnitudes"][0]
        if (magnitude["facet"], magnitude["name"], magnitude["differing"]) != ("params_after", "0.weight", 1):
            sys.exit(f"the one-ulp write measured as {magnitude}")
    pairs = len(result["replay"]["runs"]) // 2
    ratio = median(replays) / median(by_hand)
    print(f"divergence at step {PERTURBED}, bracketed {BRACKET[0]}-{BRACKET[1]} by the trace ({STEPS} steps)")
    print(f"  verify --replay (pins and measures it): {median(replays):6.2f} s  ({pairs} pair of replays)")
    print(f"  cascade restore --steps {STEPS}, both runs:  {median(by_hand):6.2f} s")
    print(f"  the bare script, twice:                 {median(bare):6.2f} s")
    print(f"replay / re-running those steps: {ratio:.2f}  (target ≤ {TARGET}: {verdict(ratio, TARGET)})")


if __name__ == "__main__":
    main()
