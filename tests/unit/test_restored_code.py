"""child/restored_code.py: which modules a restore's re-run takes from the worktree, in a fresh
interpreter each (imports are process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cascade_repro.child import protocol
from cascade_repro.child.restored_code import restored_code_value
from tests.plugin import git

PROBE = """
import sys
from cascade_repro.child import restored_code
restored_code.install(__import__("os").environ, sys.stderr.write)
import json, single, ns.part, only_in_checkout, pkg, pkg.sub
try:
    import pkg.newer
except ImportError as exc:
    newer = repr(exc)
found = {name: sys.modules[name].__file__ for name in
         ["json", "single", "ns.part", "only_in_checkout", "pkg", "pkg.sub", "pkg.ignored"]}
print(json.dumps({**found, "sys.path": sys.path, "pkg.newer": newer}))
"""


def _tree(base: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)


def _probe(checkout: Path, worktree: Path, *paths: Path) -> tuple[dict[str, Any], str]:
    given = restored_code_value(str(checkout), str(worktree), str(checkout / ".cascade"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), *sys.path[1:]]),
           protocol.ENV_RESTORED_CODE: given}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout), done.stderr


def test_modules_found_in_the_checkout_come_from_the_worktree_where_it_has_them(tmp_path: Path) -> None:
    checkout = tmp_path / "proj"
    worktree = checkout / ".cascade" / "restore" / "v1"  # where restore puts it: inside the checkout
    _tree(checkout, {"src/single.py": "", "src/pkg/__init__.py": "from pkg import ignored\n",
                     "src/pkg/sub.py": "", "src/pkg/newer.py": "", "src/only_in_checkout.py": "",
                     "ns/part.py": "", ".gitignore": "ignored.py\n.cascade/\n"})  # fmt: skip
    git(checkout, "init", "-q")
    git(checkout, "add", "-A")
    _tree(checkout, {"src/pkg/ignored.py": ""})  # built in place, say: git ignores it
    _tree(worktree, {"src/single.py": "", "src/pkg/__init__.py": "from pkg import ignored\n",
                     "src/pkg/sub.py": "", "ns/part.py": ""})  # fmt: skip

    found, said = _probe(checkout, worktree, checkout / "src", checkout)

    assert found["single"] == str(worktree / "src/single.py")
    assert found["pkg"] == str(worktree / "src/pkg/__init__.py")
    assert found["pkg.sub"] == str(worktree / "src/pkg/sub.py")  # a submodule follows its package
    assert found["ns.part"] == str(worktree / "ns/part.py")  # a namespace package's directories too
    # what the restored code lacks is read from the checkout where git does not track it there; a
    # module git tracks there is newer than the recorded commit: not found, as then
    assert found["pkg.ignored"] == str(checkout / "src/pkg/ignored.py")
    assert found["pkg.newer"] == "ModuleNotFoundError(\"No module named 'pkg.newer'\")"
    assert found["only_in_checkout"] == str(checkout / "src/only_in_checkout.py")
    assert found["json"] != "" and not found["json"].startswith(str(tmp_path))  # elsewhere: untouched
    assert "imports pkg from the restored code (src/pkg)" in said
    assert "imports single from the restored code (src/single.py)" in said
    assert f"only_in_checkout is not in the restored code: imported from this checkout ({checkout}" in said
    assert "src/only_in_checkout.py), as found now (the recorded commit does not have it)" in said
    # what processes multiprocessing spawns are given (no finder there): the worktree's directories first
    first = [str(worktree / "src"), str(checkout / "src"), str(worktree), str(checkout)]
    assert f"pkg.ignored is not in the restored code: imported from this checkout ({checkout}" in said
    assert found["sys.path"][1:5] == first


def test_the_worktree_s_own_modules_are_left_as_found(tmp_path: Path) -> None:
    checkout, worktree = tmp_path / "proj", tmp_path / "proj" / ".cascade" / "restore" / "v1"
    _tree(worktree, {"src/single.py": "", "src/pkg/__init__.py": "from pkg import ignored\n",
                     "src/pkg/sub.py": "", "src/pkg/ignored.py": "", "src/only_in_checkout.py": "",
                     "ns/part.py": ""})  # fmt: skip

    found, said = _probe(checkout, worktree, worktree / "src", worktree)

    assert found["pkg"] == str(worktree / "src/pkg/__init__.py") and said == ""


def test_a_module_git_does_not_track_beside_the_script_is_read_from_the_checkout(tmp_path: Path) -> None:
    """An ignored `local_config.py` (or a compiled extension) beside train.py is not in the restored
    code; the recorded run read it from the checkout. A module git tracks there is newer: not found."""
    checkout, worktree = tmp_path / "proj", tmp_path / "proj" / ".cascade" / "restore" / "v1"
    _tree(checkout, {"train.py": "", "newer.py": "", ".gitignore": "local_config.py\n.cascade/\n"})
    git(checkout, "init", "-q")
    git(checkout, "add", "-A")
    _tree(checkout, {"local_config.py": "LR = 0.1\n"})
    _tree(worktree, {"train.py": ""})
    given = restored_code_value(str(checkout), str(worktree), str(checkout / ".cascade"))
    probe = ("import sys; from cascade_repro.child import restored_code; "
             "restored_code.install(__import__('os').environ, sys.stderr.write); "
             "sys.path.insert(1, sys.argv[1]); "
             "import local_config; print(local_config.__file__)\n"
             "try:\n    import newer\nexcept ImportError:\n    print('newer: not found')")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe, str(worktree)], capture_output=True, text=True,
                          env={**os.environ, protocol.ENV_RESTORED_CODE: given}, check=True)  # fmt: skip
    assert done.stdout.split("\n")[:2] == [str(checkout / "local_config.py"), "newer: not found"]
    assert "local_config is not in the restored code: imported from this checkout" in done.stderr
