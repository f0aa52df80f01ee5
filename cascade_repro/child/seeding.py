"""Seed every RNG from the run's seed and apply the determinism mode, as libraries get imported."""

from __future__ import annotations

import os
import random
import sys
from types import ModuleType
from typing import Any, Callable

from cascade_repro.child import protocol


def seed_python(seed: int) -> None:
    random.seed(seed)


def prepare_environment(mode: str) -> dict[str, str]:
    """Environment that must be in place before torch initializes CUDA; returns what was set."""
    applied: dict[str, str] = {}
    if mode != "off" and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        # cuBLAS needs a fixed workspace for deterministic results (CUDA >= 10.2).
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        applied["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return applied


def on_numpy_import(numpy: ModuleType, seed: int) -> dict[str, Any]:
    numpy.random.seed(seed % 2**32)
    return {"numpy.random.seed": seed % 2**32}


def on_torch_import(torch: ModuleType, seed: int, mode: str,
                    on_import: Callable[[str, Callable[[ModuleType], None]], None] | None = None,
                    ) -> dict[str, Any]:  # fmt: skip
    """Seed torch (CPU and, lazily, every CUDA device) and apply the determinism flags; `on_import`
    (the child's import hooks) sets what must wait until a module is imported."""
    applied: dict[str, Any] = {}
    torch.manual_seed(seed)  # also queues the seed for every CUDA device without initializing CUDA
    applied["torch.manual_seed"] = seed
    threads = os.environ.get(protocol.ENV_NUM_THREADS)
    if threads:  # `cascade restore`: the thread count the recorded run had (CPU reductions depend on it)
        torch.set_num_threads(int(threads))
        applied["torch.set_num_threads"] = int(threads)
    if mode == "off":
        return applied
    _use_deterministic_algorithms(torch, mode == "warn", on_import)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    applied["torch.use_deterministic_algorithms"] = True
    applied["torch.use_deterministic_algorithms.warn_only"] = mode == "warn"
    applied["torch.backends.cudnn.benchmark"] = False
    applied["torch.backends.cudnn.deterministic"] = True
    return applied


INDUCTOR_CONFIG = "torch._inductor.config"


def _use_deterministic_algorithms(torch: ModuleType, warn_only: bool,
                                  on_import: Callable[[str, Callable[[ModuleType], None]], None] | None,
                                  ) -> None:  # fmt: skip
    """`torch.use_deterministic_algorithms(True)`, whose first call imports torch's compiler config
    (torch._dynamo, sympy: ~1 s here, as long as `import torch` itself) only to set its
    `deterministic` flag: the flag is set here when the script's own `torch.compile` imports it."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or on_import is None:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        return
    setter(True, warn_only=warn_only)
    config = sys.modules.get(INDUCTOR_CONFIG)
    if config is not None:
        config.deterministic = True  # type: ignore[attr-defined]
    else:
        on_import(INDUCTOR_CONFIG, lambda module: setattr(module, "deterministic", True))


def mode_from_env() -> str:
    mode = os.environ.get(protocol.ENV_DETERMINISM, "warn")
    return mode if mode in protocol.DETERMINISM_MODES else "warn"
