"""The child's import hooks (child/hooks.py) with real imports."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from cascade_repro.child.hooks import ImportHooks


def test_a_spec_only_looked_up_keeps_the_callback_for_the_real_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers asks `importlib.util.find_spec("mlflow")` before importing it: the callback
    must still run when the module is executed, once."""
    (tmp_path / "cascade_probe_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[object] = []
    hooks = ImportHooks(before={}, after={"cascade_probe_module": seen.append})
    hooks.install()
    try:
        assert importlib.util.find_spec("cascade_probe_module") is not None and seen == []
        module = importlib.import_module("cascade_probe_module")
        assert seen == [module]
        importlib.reload(module)
        assert seen == [module]  # once
    finally:
        sys.meta_path.remove(hooks)
        sys.modules.pop("cascade_probe_module", None)
