"""`torch.use_deterministic_algorithms(True)` as the child applies it: without importing torch's
compiler config (~1 s, as long as `import torch`), whose flag is set when the script imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import sys
from cascade_repro.child.hooks import ImportHooks
from cascade_repro.child import seeding

hooks = ImportHooks(before={}, after={})
hooks.install()
import torch
applied = seeding.on_torch_import(torch, 3, sys.argv[1], on_import=hooks.after)
print("compiler config imported:", "torch._inductor.config" in sys.modules)
print("deterministic:", torch.are_deterministic_algorithms_enabled(),
      torch.is_deterministic_algorithms_warn_only_enabled())
print("applied:", applied["torch.use_deterministic_algorithms"],
      applied["torch.use_deterministic_algorithms.warn_only"])
import torch._inductor.config as config
print("compiler flag:", config.deterministic)
"""


@pytest.mark.parametrize("mode, warn_only", [("warn", True), ("strict", False)])
def test_torch_s_flags_are_set_and_the_compiler_s_once_it_is_imported(mode: str, warn_only: bool) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=300,
                          check=True)  # fmt: skip
    assert done.stdout.splitlines() == [
        "compiler config imported: False",
        f"deterministic: True {warn_only}",
        f"applied: True {warn_only}",
        "compiler flag: True",
    ], done.stderr
