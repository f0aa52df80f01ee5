"""`cascade restore --docker` with the recorded image present: builds performed (target 0) and the
time from the command to the script's first line, beside what a bare container start costs:
`docker image inspect IMAGE` + `docker run --rm IMAGE true` (target ratio ≤ 1.5).

Needs a Docker engine (`make test` as root starts one) and the local base image
(scripts/docker_base.sh); torch comes from the CPU wheel on disk through a wheelhouse, as in the tests.
restore also reads the record (a local sqlite store without importing MLflow), materializes the
worktree and prints the plan before the container starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from common import CASCADE, HERE, ROOT, clean_env, median, scratch_repo, verdict

REPEATS = 3
BASE = "cascade-test/python:3.11-bookworm"


def main() -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "docker_base.sh"), BASE], check=True)
    wheels = ROOT / "test-artifacts" / "wheelhouse"
    pins = [f"torch=={version('torch').partition('+')[0]}", f"xxhash=={version('xxhash')}"]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *pins], check=True)
    repo = scratch_repo({"first_line.py": HERE / "scripts" / "first_line.py"})
    (repo / "requirements.lock").write_text(pins[0] + "\n")
    (repo / "cascade.yaml").write_text(
        f"docker:\n  base_image: {BASE}\n  wheelhouse: {wheels}\n  offline: true\n"
    )
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@e"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "docker"], cwd=repo, check=True)
    env = clean_env()
    started = time.time()
    record = [*CASCADE, "run", "--docker", "--tag", "v1", "first_line.py"]
    subprocess.run(record, cwd=repo, env=env, check=True, capture_output=True)
    print(f"recorded v1 with --docker in {time.time() - started:.1f} s (image built or reused)")
    record = json.loads(subprocess.run([*CASCADE, "show", "v1", "--json"], cwd=repo, env=env, check=True,
                                       capture_output=True, text=True).stdout)["data"]  # fmt: skip
    image = record["manifest"]["container"]["image_id"]

    scratch = Path(tempfile.mkdtemp(prefix="cascade-bench-docker-"))
    bare, restore, builds = [], [], 0
    for index in range(REPEATS):
        started = time.time()
        subprocess.run(["docker", "image", "inspect", image], check=True, capture_output=True)
        subprocess.run(["docker", "run", "--rm", image, "true"], check=True, capture_output=True)
        bare.append(time.time() - started)

        tree = scratch / f"restore-{index}"
        started = time.time()
        # exit 3 is expected: first_line.py has no optimizer, so there is no trace to verify
        command = [*CASCADE, "restore", "v1", "--docker", "--json", "--workdir", str(tree)]
        done = subprocess.run(command, cwd=repo, env=env, check=False, capture_output=True, text=True)
        restore.append(float((tree / "first_line.json").read_text()) - started)
        data = json.loads(done.stdout)["data"]
        builds += 0 if data["image"]["source"] == "recorded" and not data["image"]["built"] else 1

    ratio = median(restore) / median(bare)
    print(f"docker builds during {REPEATS} restores with the image present: {builds}  (target 0)")
    print(f"restore --docker to the script's first line: {median(restore):.2f} s (median of {REPEATS})")
    print(f"docker image inspect + docker run --rm IMAGE true: {median(bare):.2f} s")
    print(f"ratio {ratio:.2f}  (target ≤ 1.5: {verdict(ratio, 1.5)})")


if __name__ == "__main__":
    main()
