"""The store side of one run: opened in a thread while the child runs, finished after it.

Params, tags, the dirty state and an early record go to MLflow as soon as capture is done; after the
child ended, the metrics are flushed, checkpoints finished (pointers, push), and the final record,
output log and trace written before the run is closed with its status.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro import distributed
from cascade_repro.capture import earlier_outputs
from cascade_repro.capture.files import (
    RunFiles,
    inputs_warning,
    outside_noted,
    read_opened,
    read_outside,
    redirected_outputs,
    sort_files,
)
from cascade_repro.capture.git import GitState, excluded
from cascade_repro.capture.snapshot import empty_snapshot
from cascade_repro.child import protocol
from cascade_repro.errors import CascadeError, StoreError
from cascade_repro.manifest import ARTIFACT_PATH, Manifest
from cascade_repro.params import resolved_dict, unused_overrides, used_params
from cascade_repro.record_sections import DataEntry
from cascade_repro.run_plan import Notify, RunPlan, RunResult
from cascade_repro.run_record import (
    build_manifest,
    end_tags,
    lost_at_the_end,
    seed_notice,
    start_tags,
    status_of,
)
from cascade_repro.settings import sqlite_path
from cascade_repro.store import local_record, spool
from cascade_repro.store.checkpoint_keeper import CheckpointKeeper, CheckpointsRecorded, finish_checkpoints
from cascade_repro.store.delivery import Delivery, dir_op, file_op, params_op, record_op, tags_op
from cascade_repro.store.metrics_writer import HEARTBEAT_S, MetricsWriter
from cascade_repro.store.mlflow_store import OpenedRun
from cascade_repro.store.run_store import RunStore
from cascade_repro.supervisor import ChildExit, RunningChild

log = logging.getLogger(__name__)
NOT_CAPTURED = "not captured: the cascade process ended before capture finished"
UNTRACKED_DIR = "untracked"  # in the run directory: the untracked files as capture read and hashed them


# A file the run wrote has a time at or after the run's start: the script starts tens of
# milliseconds after it, more than the tick the kernel's coarse file clock lags time.time() by. A
# file written just before (restore's worktree, then its re-run) must not count: no slack.
_CLOCK_SLACK_MS = 0


class Worker(threading.Thread):
    """A thread that keeps its result or exception for the joiner."""

    def __init__(self, name: str, target: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self._fn = target
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # handed to the joiner
            self.error = exc

    def value(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.result


class Recording:
    """The store side of one run: opened in a thread while the child runs, finished after it."""

    def __init__(self, plan: RunPlan, run_dir: Path, start_ms: int, child: RunningChild, capture: Worker,
                 notify: Notify, keeper: CheckpointKeeper) -> None:  # fmt: skip
        self.plan = plan
        self.run_dir = run_dir
        self.start_ms = start_ms
        self.child = child
        self.capture = capture
        self.notify = notify
        self.keeper = keeper
        self.mlflow: Any = None
        self.store: RunStore | None = None
        self.opened: OpenedRun | None = None
        self.writer: MetricsWriter | None = None
        self.delivery: Delivery | None = None
        self.warnings: list[str] = []
        self.read_outside: list[str] = []  # files the script read outside the repository (named only)
        self.peak_rss_mb = 0.0
        self.ledger = spool.Ledger.load(run_dir)
        self.tags = {**start_tags(plan), spool.SPOOL_TAG: run_dir.name}
        try:
            self._spool_plan()
        except OSError as exc:  # recording goes on; only a recovery after our death would miss it
            self.warnings.append(f"the run directory cannot hold the recovery plan ({exc.strerror or exc})")

    # -- while the child runs -------------------------------------------------------------
    def open(self) -> None:
        """Each write below is delivered on its own (store/delivery.py): one refused or undelivered
        part never keeps the others from the store, and what is not stored stays in the spool."""
        plan = self.plan
        try:
            self.store = store = RunStore(plan.settings.tracking_uri, plan.settings.experiment)
            existing = plan.environ.get("MLFLOW_RUN_ID") or None
            self.mlflow = store.recording_client(existing)
            self.opened = store.open_run(plan.settings.artifact_root, plan.run_name, self.tags, self.start_ms,
                                         existing_run_id=existing, client=self.mlflow)  # fmt: skip
        except BaseException:
            self.child.terminate()
            raise
        run_id = self.opened.run_id
        try:
            (self.run_dir / protocol.RUN_ID_FILE).write_text(run_id, encoding="utf-8")
        except OSError as exc:  # the script's own mlflow calls then get a run of their own
            self.warnings.append(f"the run id could not be handed to the script: {exc}")
        layout = plan.distributed
        if layout is not None and layout.job:  # the other ranks' scripts log into this run too
            try:
                job_dir = layout.job_dir(plan.settings.root)
                job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                (job_dir / protocol.RUN_ID_FILE).write_text(run_id, encoding="utf-8")
            except OSError as exc:
                self.warnings.append(f"the run id could not be handed to the other ranks: {exc}")
        self.ledger.update(run_id=run_id, experiment=self.opened.experiment)
        self.delivery = delivery = Delivery(self.mlflow, run_id, self.ledger, plan.settings.tracking_uri)
        self.writer = MetricsWriter(
            delivery,
            self.run_dir,
            flush_s=plan.settings.metrics_flush_s,
            sample=self._sample_memory,
            notify=self.notify,
            heartbeat_s=HEARTBEAT_S,
        ).start()
        self.notify(f"run {run_id} · experiment {self.opened.experiment} · {plan.settings.tracking_uri}")
        if plan.container is not None:  # what the image was built from, to rebuild it on restore
            for name, text in (("Dockerfile", plan.container.prepared.dockerfile),
                               ("requirements.txt", plan.container.prepared.requirements)):  # fmt: skip
                if text:  # an image reused by ID whose record lacked them has nothing to add
                    (self.run_dir / name).write_text(text, encoding="utf-8")
                    delivery.do(file_op(self.run_dir / name, "cascade"))
        captured = self.capture.value()
        git: GitState = captured["git"]
        # Params wait for the end (finish): only then is it known what the script used, and the
        # script's own mlflow.log_params have landed first, so none of its batches meets ours.
        delivery.do(tags_op("git", {"cascade.dirty": str(git.dirty).lower(),
                                    "mlflow.source.git.repoURL": git.remotes.get("origin")}))  # fmt: skip
        self._log_dirty_state(git)
        if git.earlier_outputs:
            self.notify(f"left out {len(git.earlier_outputs)} file(s) earlier runs wrote, unchanged since "
                        "(not uncommitted changes; the record's git.earlier_outputs names them)")  # fmt: skip
        early = build_manifest(
            self.plan, self.opened, self.start_ms, self.run_dir, captured, facts={}
        )  # kept if the parent dies before finish()
        delivery.keep_record(delivery.annotate(early.to_dict(), 0))
        self.ledger.update(stage="captured")
        delivery.do(record_op(ARTIFACT_PATH))

    # -- after the child ended --------------------------------------------------------------
    def _outcome(self, ended: ChildExit, facts: Mapping[str, Any], status: str, signal: Any,
                 end_ms: int) -> dict[str, Any]:  # fmt: skip
        """The record's outcome section; what the child could not say is named in it and warned about."""
        refused = (facts.get("determinism") or {}).get("stopped_by")
        if refused:
            self.warnings.append(
                f"--deterministic strict stopped the script: torch has no deterministic implementation of "
                f"{refused}. Replace that op, or run with --deterministic warn to record it and go on"
            )
        outcome = {
            "status": status,
            "exit_code": ended.exit_code,
            "signal": signal,
            "start_time": self.start_ms / 1000,
            "end_time": end_ms / 1000,
            "duration_s": round((end_ms - self.start_ms) / 1000, 3),
            "error": facts.get("exception"),
        }
        if ended.log_error:  # the run directory's disk filled up: the terminal got all of it, the log not
            outcome["output_log"] = f"incomplete: {ended.log_error}"
        if facts.get("errors"):  # parts of the child's exit facts it could not take: named, not lost
            outcome["child_errors"] = facts["errors"]
            lost = "; ".join(f"{part} ({error})" for part, error in facts["errors"].items())
            self.warnings.append(f"the script's exit facts are incomplete: {lost}")
        cut = lost_at_the_end(ended, facts, self.run_dir, self.ledger.unsaved)
        if cut:
            outcome["missing"] = [*outcome.get("missing", []), *cut]
        return outcome

    def _checkpoints(self, captured: Mapping[str, Any], files: RunFiles) -> CheckpointsRecorded:
        """The checkpoints into the DVC cache and remote, with the data the run read (pushed with them)."""
        assert self.delivery is not None
        read = [str(d.object_md5) for d in DataEntry.each(captured.get("data")) if d.object_md5]
        read += [str(i["md5"]) for i in files.inputs if i.get("md5")]
        try:
            settings = self.plan.settings
            checkpoints = finish_checkpoints(self.keeper, self.delivery, settings.dvc_remote,
                                             settings.log_checkpoints, self.notify, read)  # fmt: skip
        except Exception as exc:  # the run is still closed with its outcome and what the keeper saw
            self.warnings.append(f"checkpoints not fully recorded: {type(exc).__name__}: {exc}")
            checkpoints = CheckpointsRecorded([e.to_dict() for e in self.keeper.entries], [], {})
        finally:
            if self.keeper.cache is not None:
                self.keeper.cache.close()
        self.warnings.extend(checkpoints.warnings)
        return checkpoints

    def finish(self, ended: ChildExit) -> RunResult:
        assert self.opened is not None and self.writer is not None and self.delivery is not None
        run_id = self.opened.run_id
        end_ms = int(time.time() * 1000)
        facts = spool.read_json(self.run_dir / protocol.FACTS_FILE)
        status = status_of(ended)
        signal = ended.signal_received or ended.killed_by_signal
        self.ledger.update(ended={"status": status, "exit_code": ended.exit_code, "signal": signal,
                                  "end_ms": end_ms})  # fmt: skip
        params = used_params(resolved_dict(self.plan.params), facts)
        self.warnings.extend(unused_overrides(params, self.plan.script_rel))
        self.delivery.do(params_op(params))
        resources = self._resources(facts)
        self.writer.add(resources)
        self.writer.stop()
        if self.writer.errors:
            self.warnings.extend(self.writer.errors[:3])
        outcome = self._outcome(ended, facts, status, signal, end_ms)
        try:
            captured = self.capture.value()
        except Exception as exc:  # the run still gets closed with its outcome
            self.warnings.append(f"capture failed: {exc}")
            captured = empty_snapshot()
        files = self._run_files(captured)
        if files.left_out:  # named by show, diff and restore: the record does not hold every input
            outcome["inputs_not_recorded"] = files.left_out
        self._note_read_outside(outcome)
        checkpoints = self._checkpoints(captured, files)
        self._remember_outputs(files, checkpoints)
        for name in (protocol.OUTPUT_LOG, protocol.TRACE_FILE):  # before the record, which says if stored
            if (self.run_dir / name).exists():
                self.delivery.do(file_op(self.run_dir / name, "cascade"))
        layout = self._ranks()
        metrics = {**self.writer.summary_dict(), "resources": resources}
        manifest = self._manifest(captured, facts).with_outcome(
            outcome, metrics=metrics, checkpoints=checkpoints.entries, inputs=files.inputs,
            outputs=files.outputs, distributed=layout,
        )  # fmt: skip
        closing_tags = {**end_tags(manifest), **checkpoints.tags, **_dirty_tag(captured["git"])}
        missing = self.delivery.conclude(manifest.to_dict(), ARTIFACT_PATH, metrics["pending"], closing_tags,
                                         status, end_ms)  # fmt: skip
        self.warnings.extend(dict.fromkeys(self.delivery.warnings))
        notice = seed_notice(self.plan, manifest.determinism)
        if notice:
            self.notify(notice)
        missing += outcome.get("missing", [])  # (what the child could not write: the record is incomplete)
        if ended.log_error:
            missing.append(f"the run directory's disk filled up ({ended.log_error}): the output log is "
                           "incomplete (the terminal showed all of it) and metric points logged after "
                           "that may be lost (the script's stderr says when dropping began)")  # fmt: skip
        if self.ledger.unsaved:
            self.warnings.append(f"the run directory cannot hold the delivery state ({self.ledger.unsaved})")
        kept = bool(metrics["pending"] or self.delivery.pending())
        if kept:  # the spool holds what the store lacks: `cascade sync` delivers it
            self.ledger.update(parent="exited")
        else:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        record = Manifest.from_dict(self.delivery.record) if self.delivery.record else manifest
        return RunResult(
            run_id, status, ended.exit_code, self.plan.settings.tracking_uri, self.opened.experiment,
            record, tuple(self.warnings), incomplete=tuple(missing),
            spool=str(self.run_dir) if kept else None, logged={} if kept else self._logged(run_id, record),
            signal_received=ended.signal_received,
        )  # fmt: skip

    def _logged(self, run_id: str, record: Manifest) -> dict[str, float]:
        """The metrics the script logged into the run through MLflow itself, beyond cascade's own (for
        the closing line); none where the store cannot say now (it answered everything else). The
        embedded store is read from its tables: MLflow is not imported for it (test_local_record)."""
        ours = record.metrics.get("keys") or {}
        if self.store is None:
            return {}
        uri = self.plan.settings.tracking_uri
        try:
            if sqlite_path(uri) is not None:
                tables = local_record.LocalStore.open(uri, os.environ)
                row = tables.run(run_id) if tables is not None else None
                stored: Mapping[str, float] = row.metrics if row is not None else {}
            else:
                stored = self.store.get(run_id).metrics
        except (StoreError, OSError, sqlite3.Error):
            return {}
        return {k: v for k, v in stored.items() if k not in ours and not k.startswith("cascade.")}

    # -- pieces -------------------------------------------------------------------------------
    def _ranks(self) -> dict[str, Any] | None:
        """A torchrun job: the other ranks' traces and output stored beside rank 0's, and how each ended."""
        assert self.delivery is not None
        layout = self.plan.distributed
        if layout is None:
            return None
        source = layout.ranks_dir(self.run_dir, self.plan.settings.root)
        try:
            entries = distributed.collect_ranks(layout, source, self.notify)
            for path, artifact_dir in distributed.gather(layout, source, self.run_dir):
                self.delivery.do(file_op(path, artifact_dir))
        except OSError as exc:
            self.warnings.append(f"the other ranks' files are not all recorded: {exc}")
            entries = []
        if layout.remote_ranks and self.store is not None and self.opened is not None:
            from cascade_repro.node_exchange import collect_remote

            try:  # the other nodes' ranks, delivered into this run through the store
                entries += collect_remote(layout, self.store, self.opened.run_id, self.notify)
            except CascadeError as exc:
                self.warnings.append(f"the other nodes' ranks are not recorded: {exc}")
        section = layout.section(entries)
        self.warnings.extend(distributed.rank_warnings(section))
        return section

    def _spool_plan(self) -> None:
        """What a recoverer needs if this process dies: how to open the run, and a skeleton record
        (replaced once capture is done) that says what was never captured."""
        plan = self.plan
        write = spool.write_json
        write(self.run_dir / spool.PLAN_FILE, {
            "tracking_uri": plan.settings.tracking_uri, "experiment": plan.settings.experiment,
            "artifact_root": plan.settings.artifact_root, "run_name": plan.run_name, "tags": self.tags,
            "start_ms": self.start_ms, "existing_run_id": plan.environ.get("MLFLOW_RUN_ID") or None,
            "in_container": plan.container is not None,
            "resolved_params": resolved_dict(plan.params), "root": str(plan.settings.root),
            "dvc_remote": plan.settings.dvc_remote, "log_checkpoints": plan.settings.log_checkpoints,
            "env_allow_prefixes": list(plan.settings.env_allow_prefixes), "track_inputs": plan.track_inputs,
        })  # fmt: skip
        skeleton = build_manifest(
            plan, None, self.start_ms, self.run_dir, empty_snapshot(), facts={}
        ).to_dict()
        for section in ("git", "python", "hardware", "environment", "container"):
            skeleton[section] = {"unavailable": NOT_CAPTURED}
        skeleton["data"] = []
        write(self.run_dir / spool.RECORD_FILE, skeleton)

    def _log_dirty_state(self, git: GitState) -> None:
        assert self.delivery is not None
        if git.patch:
            patch = self.run_dir / "git.patch"
            patch.write_bytes(git.patch)
            self.delivery.do(file_op(patch, "cascade"))
        stored = [u for u in git.untracked if u.stored and u.symlink_target is None]
        if stored:  # copied by capture from the one read that hashed them: never read again here
            self.delivery.do(dir_op(self.run_dir / UNTRACKED_DIR, "cascade/untracked"))
        refused = [u.path for u in git.untracked if not u.stored]
        if refused:
            self.warnings.append(
                f"untracked files too large to keep ({', '.join(refused[:5])}): `dvc add` them or "
                "raise untracked_max_bytes in cascade.yaml"
            )

    def _note_read_outside(self, outcome: dict[str, Any]) -> None:
        """Files the script read outside the repository: named in the record (verify names them where
        the runs differ), never hashed, and said."""
        if self.read_outside:
            outcome["read_outside"], said = outside_noted(self.read_outside)
            self.warnings.append(said)

    def _run_files(self, captured: dict[str, Any]) -> RunFiles:
        """Inputs git and DVC cannot see, hashed (and with --track-inputs cached), and outputs the run
        wrote, which leave the dirty state: a file written while capture read it is no input."""
        settings = self.plan.settings
        git: GitState = captured["git"]
        try:
            opened = read_opened(self.run_dir / protocol.FILES_FILE, settings.root)
            self.read_outside = list(opened.get("outside") or [])
            files = sort_files(settings.root, opened, redirected_outputs(settings.root),
                               self.plan.exclude, [u.path for u in git.untracked],
                               [str(d.get("path")) for d in captured.get("data") or []], self.run_dir,
                               (self.start_ms - _CLOCK_SLACK_MS) * 1_000_000)  # fmt: skip
        except Exception as exc:  # the run is still recorded, without them
            self.warnings.append(f"inputs and outputs not recorded: {type(exc).__name__}: {exc}")
            return RunFiles()
        self.read_outside = read_outside(opened, files)
        written = {o["path"] for o in files.outputs}
        if any(u.path in written for u in git.untracked):
            kept = tuple(u for u in git.untracked if u.path not in written)
            captured["git"] = replace(git, untracked=kept, dirty=bool(git.patch) or bool(kept))
        if files.left_out:
            self.warnings.append(
                f"{files.left_out} more input file(s) were read than the record holds ({len(files.inputs)}): "
                "a restore cannot provide them; track their directory with `dvc add DIR`"
            )
        if self.plan.track_inputs and files.inputs:
            self._track_inputs(files.inputs, files.kept)
        elif files.kept:  # read, then rewritten: these bytes exist nowhere else
            self._track_inputs([i for i in files.inputs if i["path"] in files.kept], files.kept, quiet=True)
        self._name_earlier_outputs(files.inputs)
        warning = inputs_warning(files.inputs)
        if warning:
            self.warnings.append(warning)
        return files

    def _remember_outputs(self, files: RunFiles, checkpoints: CheckpointsRecorded) -> None:
        """This run's outputs and checkpoints, as it left them, noted for the next run's capture: left
        out of its dirty state while unchanged (capture/earlier_outputs.py)."""
        assert self.opened is not None
        written = [str(o["path"]) for o in files.outputs]
        written += [str(c.get("path")) for c in checkpoints.entries if c.get("status") != "pruned"]
        written = [p for p in written if not excluded(p, self.plan.exclude)]
        if not written:
            return
        try:
            earlier_outputs.remember(self.plan.settings.root, self.opened.run_id, written)
        except Exception as exc:  # the next run then records them as untracked files, as it would have
            self.warnings.append(f"this run's outputs are not noted for the next run's capture: {exc}")

    def _track_inputs(self, inputs: list[dict[str, Any]], kept: Mapping[str, Path],
                      quiet: bool = False) -> None:  # fmt: skip
        """`--track-inputs`: each input into the DVC cache (reflinked where it can be, else copied); an
        input the run rewrote from the copy the child kept of it as read (`kept`), never the file now.
        `quiet`: only those rewritten ones, without --track-inputs, and only where DVC is."""
        cache = self.keeper.cache
        if cache is None:  # (`cascade run` refuses the option without DVC: a restore's re-run, as recorded)
            if not quiet and "cascade.restored_from" not in self.plan.extra_tags:
                self.warnings.append("--track-inputs: this project has no DVC repository; `cascade init` "
                                     "(it runs `dvc init`), then run again")  # fmt: skip
            return
        for item in inputs:
            if item.get("rewritten") and item["path"] not in kept:
                continue  # its bytes as read were not kept (larger than the child copies)
            as_read = kept.get(item["path"])  # a private copy or second name nothing rewrites: linked
            try:
                source = as_read or self.plan.settings.root / item["path"]
                # linked only where nothing else names it: never the user's own file, made read-only
                stored = cache.add(source, hardlink=as_read is not None and source.stat().st_nlink == 1)
            except Exception as exc:  # DataError, OSError: the input stays recorded by its hash
                self.warnings.append(f"--track-inputs: {item['path']} not cached: {exc}")
                continue
            if stored is None or stored.size != item["size"]:
                self.warnings.append(f"--track-inputs: {item['path']} changed while it was cached")
                continue
            item["md5"] = stored.md5
        cached = [i for i in inputs if i.get("md5")]
        if cached:
            how = "as the run read them, before it rewrote them" if quiet else "(--track-inputs)"
            self.notify(f"kept {len(cached)} input file(s) in the DVC cache {how}")

    def _name_earlier_outputs(self, inputs: list[dict[str, Any]]) -> None:
        """An input an earlier run of this checkout wrote names that run (`written_by`: show and restore
        say where it came from). Where it is a checkpoint in the DVC cache already (a resume), its md5
        goes into the record too, so a restore takes it from there once a later run has saved over it.
        Nothing is copied: an earlier output the cache lacks stays as it is."""
        assert self.opened is not None
        root, cache = self.plan.settings.root, self.keeper.cache
        for item in earlier_outputs.name_writers(root, inputs, self.opened.run_id):
            if cache is None or item.get("md5"):
                continue
            try:
                stored = cache.add(root / str(item["path"]), present_only=True)
            except Exception:  # (DataError, OSError: the input stays recorded by its hash)
                continue
            if stored is not None and stored.size == item.get("size"):
                item["md5"] = stored.md5

    def _manifest(self, captured: dict[str, Any], facts: dict[str, Any]) -> Manifest:
        return build_manifest(self.plan, self.opened, self.start_ms, self.run_dir, captured, facts)

    def _sample_memory(self) -> dict[str, float]:
        rss = _vm_hwm_mb(self.child.pid)
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        return {"cascade.peak_rss_mb": self.peak_rss_mb} if rss else {}

    def _resources(self, facts: dict[str, Any]) -> dict[str, float]:
        rusage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # kB on Linux
        values = {"cascade.peak_rss_mb": round(max(self.peak_rss_mb, rusage), 1)}
        for key, value in (facts.get("gpu_memory") or {}).items():
            values[f"cascade.{key}"] = round(float(value), 1)
        return values


def _dirty_tag(git: GitState) -> dict[str, str]:
    """`cascade.dirty` again at the end: the run's own outputs may have left the dirty state since
    capture set it (`_run_files`). Nothing when capture failed (the tag was never set)."""
    return {} if git.commit == "unavailable" else {"cascade.dirty": str(bool(git.dirty)).lower()}


def _vm_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return 0.0
    return 0.0
