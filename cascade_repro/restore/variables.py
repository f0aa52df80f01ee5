"""Which of a record's environment variables a re-run may get: the record is untrusted (it may come
from a shared server), so only what an honest run records is set, and never a variable that makes a
program load code from where it points (a library, a plugin, a startup file, a compiled-kernel
cache, git's config: core.fsmonitor runs a command at the script's `git status`)."""

from __future__ import annotations

from cascade_repro.child.env_reads import MACHINE_SPECIFIC, NOT_RECORDED_PREFIXES

# Variables restore never copies from a record: they point at this machine's store and run.
NOT_RESTORED_PREFIXES = ("MLFLOW_", "CASCADE_")
# Named, so the plan can say which it left out; a user who trusts the values exports them.
CODE_LOADING = frozenset({
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
    "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE", "PYTHONWARNINGS", "PYTHONBREAKPOINT",
    "BASH_ENV", "ENV", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "PERL5OPT", "PERL5LIB",
    "PERLLIB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH", "OMP_TOOL_LIBRARIES", "OMP_TOOL",
    "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH",
    "CUDA_CACHE_PATH",
})  # fmt: skip
CODE_LOADING_PREFIXES = ("LD_", "DYLD_", "PYTHON", "GIT_")
CODE_LOADING_PARTS = ("INJECTION", "PLUGIN", "PRELOAD")  # CUDA_INJECTION64_PATH, NCCL_NET_PLUGIN


def loads_code(name: str) -> bool:
    """Whether a variable makes a program load code (PYTHONHASHSEED, which restore sets itself, apart)."""
    if name == "PYTHONHASHSEED":
        return False
    upper = name.upper()
    return (upper in CODE_LOADING or upper.startswith(CODE_LOADING_PREFIXES)
            or any(part in upper for part in CODE_LOADING_PARTS))  # fmt: skip


def recordable(name: str, allow_prefixes: tuple[str, ...], read: bool) -> bool:
    """Whether an honest run records the variable: allow-listed here, or (`read`) one the script read
    that is not the machine's or the interpreter's own (child/env_reads.py leaves those out)."""
    if read:
        return not name.startswith(NOT_RECORDED_PREFIXES) and name not in MACHINE_SPECIFIC
    return name.startswith(allow_prefixes)
