"""Entry point of the child: `python -m cascade_repro.child.bootstrap SCRIPT|-m MODULE [ARGS]...`.

Seeds, installs the import hooks, then runs the script as `__main__` with its own argv, exactly as
`python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, and exits with the script's own code. What it
learns (flags applied, the torch stack, an uncaught exception, peak GPU memory) goes to `child.json` in
the run directory.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import Any, Callable

from cascade_repro.child import (
    env_reads,
    exit_work,
    file_access,
    framework_args,
    framework_checkpoints,
    framework_logging,
    parent_watch,
    parsed_args,
    protocol,
    restored_code,
    runtime,
    seeding,
    usage_errors,
)
from cascade_repro.child.checkpoints import install_torch_save_hook
from cascade_repro.child.hooks import ImportHooks
from cascade_repro.child.runtime import checkpoint_log
from cascade_repro.child.script_globals import simple_globals
from cascade_repro.child.script_seeds import ScriptSeeds

RUN_ID_WAIT_S = 300.0
GPU_SAMPLE_S = 60.0


class Facts:
    """What the child observed, saved atomically to child.json whenever it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"pid": os.getpid(), "started_at": time.time()}

    def update(self, **values: Any) -> None:
        """Merge values (or, with none, re-save sections changed in place)."""
        self._save(values, last_words=False)

    def last_words(self, **values: Any) -> None:
        """`update` at the script's end (its exception, its exit facts): on a full disk these may take
        the run directory's reserve."""
        self._save(values, last_words=True)

    def _save(self, values: dict[str, Any], last_words: bool) -> None:
        before = dict(self.data)
        self.data.update(values)
        try:
            protocol.write_json_atomic(self.path, self.data, last_words)
        except OSError:
            pass  # the run directory vanished or is full: nothing useful left to do
        except ValueError:  # a value JSON cannot write (an int of thousands of digits): left out, so
            self.data = before  # that every later save (the trace header, the exit facts) still writes


def _observe_torch(torch: ModuleType, run_dir: Path, facts: Facts, determinism: dict[str, Any],
                   script_seeds: ScriptSeeds) -> None:  # fmt: skip
    """torch's flags as the script starts, its GPU memory, and the step trace (unless turned off)."""
    from cascade_repro.child.torch_probe import flags

    determinism["flags_at_start"] = flags(torch)
    facts.update()
    _sample_gpu_memory(torch)
    interval = int(os.environ.get(protocol.ENV_TRACE_INTERVAL, "1") or 0)
    if interval <= 0:
        return
    from cascade_repro.child.trace import StepTracer
    from cascade_repro.child.trace_dump import TensorDump

    grads = {"1": True, "0": False}.get(os.environ.get(protocol.ENV_TRACE_GRADS, "auto"))
    stop = int(os.environ.get(protocol.ENV_STOP_AFTER) or 0) or None
    try:
        budget = float(os.environ.get(protocol.ENV_TRACE_BUDGET) or 0)
    except ValueError:
        budget = 0.0  # every facet every step
    schedule = _schedule(os.environ.get(protocol.ENV_TRACE_SCHEDULE))
    records = _schedule(os.environ.get(protocol.ENV_TRACE_RECORDS))
    tracer = StepTracer(torch, run_dir / protocol.TRACE_FILE, interval, grads=grads, stop_after=stop,
                        on_header=lambda header: facts.update(trace=header), budget=budget,
                        schedule=schedule, records=records)  # fmt: skip
    dump = os.environ.get(protocol.ENV_TRACE_DUMP)
    if dump:
        tracer.dump = TensorDump.parse(torch, dump)
    tracer.on_training_begins = lambda: _note_globals(facts, vars(sys.modules["__main__"]))
    tracer.install()
    script_seeds.step = tracer.reseeded
    exit_work.at_exit(tracer.close)
    checkpoint_log(run_dir).current_step = tracer.last_step
    facts.update(trace=tracer.header())


def _schedule(given: str | None) -> list[tuple[int, int]] | None:
    """A schedule a restore hands back (the steps sampled, or recorded), None to measure one."""
    from cascade_repro.child.trace_budget import parse_schedule

    try:
        return parse_schedule(json.loads(given)) if given else None
    except ValueError:
        return None


def main(argv: list[str]) -> None:
    module = argv[1] if argv[:1] == ["-m"] and len(argv) > 1 else None
    if not argv or argv == ["-m"]:
        sys.stderr.write("usage: python -m cascade_repro.child.bootstrap SCRIPT|-m MODULE [ARGS]...\n")
        raise SystemExit(2)
    script, args = (module, argv[2:]) if module else (argv[0], argv[1:])
    parent_watch.stop_with_parent()
    job_dir = Path(os.environ[protocol.ENV_RUN_DIR])
    run_dir = _own_directory(job_dir)
    seed = int(os.environ.get(protocol.ENV_SEED, "0"))
    mode = seeding.mode_from_env()
    facts = Facts(run_dir / protocol.FACTS_FILE)

    seeding.seed_python(seed)
    applied: dict[str, Any] = {"random.seed": seed, **seeding.prepare_environment(mode)}
    # One section, updated in place as libraries load and ops warn, re-saved on every change.
    determinism: dict[str, Any] = {"mode": mode, "applied": applied}
    script_seeds = _watch_script_seeds(facts, determinism)
    facts.update(determinism=determinism)

    def after_torch(torch: ModuleType) -> None:
        applied.update(seeding.on_torch_import(torch, seed, mode, on_import=hooks.after))
        facts.update()
        _guarded_hook("torch.manual_seed", lambda: script_seeds.hook_torch(torch))
        try:
            install_torch_save_hook(torch, checkpoint_log(run_dir))
        except Exception as exc:  # observing must never break the user's script
            sys.stderr.write(f"cascade: torch.save is not observed: {type(exc).__name__}: {exc}\n")
        try:
            _observe_torch(torch, run_dir, facts, determinism, script_seeds)
        except Exception as exc:  # observing must never break the user's script
            sys.stderr.write(f"cascade: the step trace is off: {type(exc).__name__}: {exc}\n")

    def after_numpy(numpy: ModuleType) -> None:
        applied.update(seeding.on_numpy_import(numpy, seed))
        facts.update()
        _guarded_hook("numpy.random.seed", lambda: script_seeds.hook_numpy(numpy))

    runtime.on_params_read(_note_params_read(facts))
    hooks = ImportHooks(
        before={"mlflow": lambda: _wait_for_run_id(job_dir)},
        after={
            **framework_logging.import_hooks(),
            **framework_checkpoints.import_hooks(checkpoint_log(run_dir)),
            **file_access.import_hooks(),  # safetensors' reader (Rust opens the file)
            "torch": after_torch,
            "numpy": after_numpy,
            "argparse": lambda module: _watch_argparse(module, facts),
            **framework_args.import_hooks(lambda source, values: facts.update(**{source: values})),
            **script_seeds.import_hooks(),
        },
    )
    restored_code.install(os.environ, sys.stderr.write)  # (before the hooks: they come first, it second)
    hooks.install()

    # (SIGHUP keeps its default: a script stuck in C code dies of a closed terminal, with nobody left to
    # send it another signal)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_once_per_second())
    interrupted = [False]  # a Ctrl-C reached the script (its handler raised KeyboardInterrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt_once_per_second(interrupted))
    _record_uncaught_exceptions(facts, determinism)
    _record_nondeterministic_ops(facts, determinism)
    reads = env_reads.record_reads()
    file_access.install(os.environ.get(protocol.ENV_ROOT), str(run_dir / protocol.FILES_FILE))
    exit_work.at_exit(_record_at_exit, facts, reads)
    exit_work.install()

    sys.argv = [script, *args]  # (a module's: its file, once runpy has found it)
    if module is None:  # (`-m`: the working directory stays first, as `python -m` puts it)
        sys.path[0] = str(Path(script).resolve().parent)
    _run_script(script, module is not None, interrupted, facts)


def _note_globals(facts: Facts, namespace: dict[str, Any]) -> None:
    """The script's module globals that may be its configuration (child/script_globals.py), once: as
    its training begins, else as it ended. Not from a forked copy (a worker)."""
    if "globals" not in facts.data and os.getpid() == facts.data["pid"]:
        facts.update(globals=simple_globals(namespace))


def _run_script(script: str, module: bool, interrupted: list[bool], facts: Facts) -> None:
    """The script (or, with `module`, the module of that name) as `__main__`; a Ctrl-C ends it as Ctrl-C
    (130), also where the script turned it into another error (an import it cut half-way fails the next
    time it runs). A script that never began training has its globals noted as it ended
    (child/script_globals.py)."""
    try:
        if module:
            namespace = runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            namespace = runpy.run_path(script, run_name="__main__")
        try:
            _note_globals(facts, namespace)
        except Exception:  # observing must never change how the script ends
            pass
    except KeyboardInterrupt:
        _die_of_sigint()
    except Exception:
        if not interrupted[0]:
            raise
        _die_of_sigint()


def _own_directory(job_dir: Path) -> Path:
    """Rank 0 (and a single process) writes in the run directory; rank K > 0 of a torchrun job in
    ranks/K/ of it, for itself and the processes it starts (DataLoader workers)."""
    rank = protocol.process_rank(os.environ)
    if rank == 0:
        return job_dir
    own = protocol.rank_dir(job_dir, rank)
    own.mkdir(parents=True, exist_ok=True, mode=0o700)
    protocol.set_aside_reserve(own)  # this rank's last words on a full disk (its exit facts)
    os.environ[protocol.ENV_RUN_DIR] = str(own)  # runtime.log_metrics and checkpoints follow it
    os.environ.pop(protocol.ENV_TRACE_DUMP, None)  # `verify --replay` saves rank 0's tensors
    return own


def _watch_argparse(argparse: ModuleType, facts: Facts) -> None:
    """One callback on the script's `import argparse`: its usage errors (an exit 2 the parent
    explains) and its parsed namespace (the params it used)."""
    usage_errors.watch(argparse, lambda error: facts.update(exception=error))
    parsed_args.watch(argparse, lambda values: facts.update(argparse=values))


def _note_params_read(facts: Facts) -> Callable[[], None]:
    """The script called `cascade_repro.params()`: the params file is then part of what it used."""
    pid = os.getpid()

    def note() -> None:
        if os.getpid() == pid and not facts.data.get("params_read"):  # not from a forked worker's copy
            facts.update(params_read=True)

    return note


def _watch_script_seeds(facts: Facts, determinism: dict[str, Any]) -> ScriptSeeds:
    """The seeds the script sets itself, beside those cascade applied (`random` is seeded already)."""
    watcher = ScriptSeeds(on_change=facts.update)
    determinism["script_seeds"] = watcher.calls  # updated in place; [] says the script set none
    watcher.on_omitted = lambda count: determinism.update(script_seeds_omitted=count)
    _guarded_hook("random.seed", watcher.hook_random)
    return watcher


def _guarded_hook(name: str, hook: Callable[[], None]) -> None:
    try:
        hook()
    except Exception as exc:  # observing must never break the user's script
        sys.stderr.write(f"cascade: {name} calls are not observed: {type(exc).__name__}: {exc}\n")


def _die_of_sigint() -> None:
    # What `python script.py` does on an uncaught Ctrl-C (CPython does not for `-m` modules):
    # print the traceback, run atexit handlers (our flush), then die of SIGINT so the parent and
    # shells see "killed by signal 2", exit status 130.
    sys.excepthook(*sys.exc_info())
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(130)  # only reached if SIGINT is blocked


def _sample_gpu_memory(torch: ModuleType, every_s: float = GPU_SAMPLE_S) -> None:
    """On long runs, log peak GPU memory every minute (only once the script itself uses CUDA)."""
    from cascade_repro.child import runtime
    from cascade_repro.child.torch_probe import gpu_memory

    def loop() -> None:
        started = time.monotonic()
        while True:
            time.sleep(every_s)
            figures = gpu_memory(torch)  # {} until CUDA is initialized; never initializes it
            if figures:
                step = int(time.monotonic() - started)
                runtime.log_metrics({f"cascade.{k}": v for k, v in figures.items()}, step=step)

    threading.Thread(target=loop, name="cascade-gpu-memory", daemon=True).start()


def _wait_for_run_id(run_dir: Path) -> None:
    """Called when the script first imports mlflow: make it log into the cascade run."""
    path = run_dir / protocol.RUN_ID_FILE
    deadline = time.monotonic() + RUN_ID_WAIT_S
    while time.monotonic() < deadline:
        if path.exists():
            run_id = path.read_text(encoding="utf-8").strip()
            if run_id:
                os.environ["MLFLOW_RUN_ID"] = run_id
            return
        time.sleep(0.02)
    sys.stderr.write("cascade: no MLflow run id from the parent; mlflow calls get their own run\n")


def _exit_once_per_second() -> Callable[[int, FrameType | None], None]:
    """SIGTERM unwinds the script (SystemExit 143), so that its own clean-up and the atexit flushes
    run. A stop sent to the whole group (`systemctl stop`, Slurm's scancel, `timeout`) reaches the
    script twice, directly and forwarded by the parent; a parent killed outright
    sends its death signal once per thread of it that exits while it is the script's parent (Linux
    hands the script from one dying thread to the next)."""

    def stop(signum: int) -> None:
        raise SystemExit(128 + signum)

    return _once_per_second(stop)


def _interrupt_once_per_second(interrupted: list[bool]) -> Callable[[int, FrameType | None], None]:
    """Ctrl-C raises KeyboardInterrupt in the script; a terminal's reaches it twice (directly and
    forwarded by the parent)."""

    def interrupt(signum: int) -> None:
        interrupted[0] = True
        raise KeyboardInterrupt

    return _once_per_second(interrupt)


def _once_per_second(act: Callable[[int], None]) -> Callable[[int, FrameType | None], None]:
    """A signal handler doing `act` (which raises) at most once a second: the repeat of a signal must
    not raise again in the middle of the clean-up that the first one started."""
    last = [-10.0]

    def handler(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0:
            return
        last[0] = now
        act(signum)

    return handler


def _record_nondeterministic_ops(facts: Facts, determinism: dict[str, Any]) -> None:
    """Names of the ops that torch reports as nondeterministic (mode warn) during the run."""
    import warnings

    original = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:  # fmt: skip
        op = protocol.nondeterministic_op(str(message))
        if op is not None:
            _note_nondeterministic_op(facts, determinism, op)
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def _note_nondeterministic_op(
    facts: Facts, determinism: dict[str, Any], op: str, stopped: bool = False
) -> None:
    ops = determinism.setdefault("nondeterministic_ops", [])
    if op in ops and not stopped:
        return
    if op not in ops:
        ops.append(op)
    if stopped:
        determinism["stopped_by"] = op
    facts.update()


def _record_uncaught_exceptions(facts: Facts, determinism: dict[str, Any]) -> None:
    """The exception that ended the script; in mode strict, the op torch refused is named too."""
    original = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        facts.last_words(exception={"type": kind.__name__, "message": str(value)[:2000]})
        op = protocol.nondeterministic_op(str(value))
        if op is not None:
            _note_nondeterministic_op(facts, determinism, op, stopped=True)
        original(kind, value, tb)

    sys.excepthook = hook


def _record_at_exit(facts: Facts, env_names: set[str]) -> None:
    """Each part of the exit facts on its own: one that fails is named in `errors` (the parent puts
    it in the record), never keeps the others out and never prints a traceback after the script's."""
    values: dict[str, Any] = {"ended_at": time.time()}
    parts: dict[str, Callable[[], Any]] = {"environment_read": lambda: env_reads.values_read(set(env_names))}
    module = sys.modules.get("torch")
    if module is not None and hasattr(module, "__version__"):
        from cascade_repro.child.torch_probe import gpu_memory, torch_stack

        torch: ModuleType = module
        parts.update(torch=lambda: torch_stack(torch), gpu_memory=lambda: gpu_memory(torch))
    errors: dict[str, str] = {}
    for name, part in parts.items():
        try:
            values[name] = part()
        except Exception as exc:  # reported in the record, not on the terminal
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
    waiting = runtime.write_checkpoint_notes()  # (a full run directory kept them waiting)
    if waiting:
        errors["checkpoints"] = waiting
    if errors:
        values["errors"] = errors
    facts.last_words(**values)
    if waiting:  # the reserve, given up for the facts, may take them now: the facts say what is left
        left = runtime.write_checkpoint_notes()
        if left != waiting:
            errors.pop("checkpoints")
            if left:
                errors["checkpoints"] = left
            facts.last_words(errors=errors or None)


if __name__ == "__main__":
    main(sys.argv[1:])
