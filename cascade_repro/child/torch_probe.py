"""Read the torch software stack and the flags in force, from inside the training process.

Each probe may answer "unavailable" without failing the run. CUDA is only asked about when the
script has already initialized it, so a CPU-only machine (or a DataLoader forking later) never
sees CUDA touched by cascade.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any, Callable


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # a probe never fails the run
        return f"unavailable: {type(exc).__name__}"


def torch_stack(torch: ModuleType) -> dict[str, Any]:
    config = _safe(lambda: torch.__config__.show())
    config = config if isinstance(config, str) else ""
    cuda_available = bool(_safe(torch.cuda.is_available) is True)
    cuda_initialized = bool(_safe(torch.cuda.is_initialized) is True)
    stack: dict[str, Any] = {
        "version": torch.__version__,
        "git_version": _safe(lambda: torch.version.git_version),
        "debug": _safe(lambda: bool(torch.version.debug)),
        "cuda": _safe(lambda: torch.version.cuda),
        "hip": _safe(lambda: torch.version.hip),
        "cudnn": _safe(lambda: torch.backends.cudnn.version()) if cuda_available else None,
        "nccl": _safe(lambda: ".".join(map(str, torch.cuda.nccl.version()))) if cuda_available else None,
        "cuda_available": cuda_available,
        "cpu_capability": _safe(lambda: torch.backends.cpu.get_cpu_capability()),
        "num_threads": _safe(torch.get_num_threads),
        "num_interop_threads": _safe(torch.get_num_interop_threads),
        "mkl_available": _safe(lambda: torch.backends.mkl.is_available()),
        "mkldnn_available": _safe(lambda: torch.backends.mkldnn.is_available()),
        "mkl_version": _match(config, r"Math Kernel Library Version ([\w.]+)"),
        "onednn_version": _match(config, r"(?:MKL-DNN|oneDNN) v([\w.]+)"),
        "openmp": _match(config, r"OpenMP (\d+)"),
        "cxx_abi": _match(config, r"CXX_ABI_FLAG=\s*(\S+)|_GLIBCXX_USE_CXX11_ABI=(\d)"),
        "flags": flags(torch),
    }
    if cuda_available and cuda_initialized:
        stack["gpus"] = _gpus(torch)
    return stack


def flags(torch: ModuleType) -> dict[str, Any]:
    """Every flag that can change bitwise results, as in force right now."""
    matmul = torch.backends.cuda.matmul
    return {
        "deterministic_algorithms": _safe(torch.are_deterministic_algorithms_enabled),
        "deterministic_warn_only": _safe(torch.is_deterministic_algorithms_warn_only_enabled),
        "cudnn.benchmark": _safe(lambda: torch.backends.cudnn.benchmark),
        "cudnn.deterministic": _safe(lambda: torch.backends.cudnn.deterministic),
        "cudnn.allow_tf32": _safe(lambda: torch.backends.cudnn.allow_tf32),
        "cuda.matmul.allow_tf32": _safe(lambda: matmul.allow_tf32),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": _safe(
            lambda: matmul.allow_fp16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": _safe(
            lambda: matmul.allow_bf16_reduced_precision_reduction
        ),
        "float32_matmul_precision": _safe(torch.get_float32_matmul_precision),
    }


def gpu_memory(torch: ModuleType) -> dict[str, float]:
    """Peak allocated/reserved memory per initialized CUDA device, in MiB."""
    # is_initialized first: it reads a flag, while is_available() may start the CUDA driver,
    # which would break CUDA in DataLoader workers forked later.
    if not (_safe(torch.cuda.is_initialized) is True and _safe(torch.cuda.is_available) is True):
        return {}
    out: dict[str, float] = {}
    for index in range(torch.cuda.device_count()):
        mib = 1024 * 1024
        out[f"gpu{index}.max_memory_allocated_mb"] = torch.cuda.max_memory_allocated(index) / mib
        out[f"gpu{index}.max_memory_reserved_mb"] = torch.cuda.max_memory_reserved(index) / mib
    return out


def _gpus(torch: ModuleType) -> list[dict[str, Any]]:
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_mb": props.total_memory // (1024 * 1024),
                "compute_capability": f"{props.major}.{props.minor}",
                "sm_count": props.multi_processor_count,
                "uuid": str(getattr(props, "uuid", "")) or None,
            }
        )
    return gpus


def _match(text: str, pattern: str) -> str | None:
    found = re.search(pattern, text)
    if not found:
        return None
    return next((g for g in found.groups() if g), None)
