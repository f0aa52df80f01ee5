"""A script configured by its module's globals (nanoGPT's way): which globals are its configuration."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import math
import os
import socket
import time
import types
import uuid
from pathlib import Path

import pytest

from cascade_repro.child.bootstrap import Facts
from cascade_repro.child.script_globals import simple_globals
from cascade_repro.params import used_params


def test_simple_values_are_configuration_and_clock_readings_data_and_private_names_are_not() -> None:
    namespace = {
        "__name__": "__main__", "_private": 1, "os": os, "main": simple_globals,
        "lr": 6e-4, "steps": 5000, "amp": True, "device": "cpu", "resume": None, "betas": (0.9, 0.95),
        "inf": math.inf, "max_time": 3600.0, "warmup_s": 10000.0,  # whole seconds: no clock reads those
        "t0": time.time(), "started": time.perf_counter(), "begun": time.monotonic(),
        "ns": time.time_ns() | 1, "t0_ns": time.perf_counter_ns() | 1, "m0_ns": time.monotonic_ns() | 1,
        "tokens": time.monotonic_ns() // 10**9 * 10**9,  # a round budget that uptime passed: kept
        "text": "First Citizen:\nBefore we proceed any further, hear me speak.\n",  # a dataset in memory
        "chars": sorted(set("abcdefghijklmnopqrstuvwxyz")), "nested": [[1]], "huge": 10**5000,
    }  # fmt: skip
    noted = simple_globals(namespace)
    assert noted == {
        "lr": 6e-4, "steps": 5000, "amp": True, "device": "cpu", "resume": None, "betas": [0.9, 0.95],
        "inf": "inf", "max_time": 3600.0, "warmup_s": 10000.0, "tokens": namespace["tokens"],
    }  # fmt: skip
    json.dumps(noted)


def test_strings_made_from_the_clock_the_process_or_the_host_are_not_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run directory named by the date, a uuid, the pid: different in every run, so two runs of the
    same code differed in params and verify took that for the cause of any divergence."""
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-17.cluster")
    monkeypatch.setattr(os, "getpid", lambda: 4124)
    now = datetime.datetime.now()
    utc = datetime.datetime.now(datetime.timezone.utc)
    per_run = {
        "out_dir": f"runs/{now:%Y%m%d-%H%M%S}", "day": f"{now:%Y-%m-%d}", "us": f"{now:%m/%d/%Y} run",
        "eu": f"log_{now:%d.%m.%Y}", "short": f"{now:%y%m%d}_a", "iso": now.isoformat(),
        "stamp": f"exp_{int(time.time())}", "ms": f"t{int(time.time() * 1000)}", "float": str(time.time()),
        "run_id": str(uuid.uuid4()), "log": f"train-{os.getpid()}.log", "host": f"{socket.gethostname()}-0",
        "in_list": ["a", f"{now:%Y%m%d}"], "dmy": f"run_{now:%d-%m-%y}", "utc": f"runs/{utc:%Y%m%d-%H%M%S}",
        "owt": "owt-4124",
    }  # fmt: skip
    kept = {
        "cutoff": "2019-05-01", "data": "shakespeare_char", "name": "gpt2-124M", "layers": "12-12-12",
        "seed_text": "1234", "tag": "v1.2.3", "lr_s": "6e-4", "ckpt": "ckpt_000100.pt",
        "dataset": "cifar4124", "model": "resnet4124", "gpu": "gpu-node", "split": "train",  # (no pid, host)
        "arch": "resnet-152", "home": "/home/ubuntu/data",
    }  # fmt: skip
    assert simple_globals({**per_run, **kept}) == kept
    # the same in a collected dict (nanoGPT's `config`)
    namespace = {**per_run, **kept, "config": {**per_run, **kept}}
    assert simple_globals(namespace) == kept


def test_a_metaclass_that_compares_itself_is_never_called() -> None:
    """From a second review: `kind in (list, tuple)` called a metaclass's __eq__, which raised, and
    every global of the run was lost with it."""

    class Meta(type):
        def __eq__(cls, other: object) -> bool:
            raise RuntimeError("meta eq")

        __hash__ = type.__hash__

    weird = Meta("Weird", (), {})()
    assert simple_globals({"w": weird, "lr": 0.1, "pair": [weird]}) == {"lr": 0.1}


def test_configuration_objects_are_read_and_other_objects_are_not() -> None:
    class TrainConfig:  # the script's own, named as a configuration
        lr = 0.1

        def __init__(self) -> None:
            self.steps = 10
            self.started = time.time()  # a clock reading, as among the globals

        @property
        def raises(self) -> int:  # never called
            raise AssertionError("a property was read")

    class Settings(dict):  # on a base of no script's: not read
        depth = 3

    class Runner:  # not named as a configuration
        epochs = 4

    class BaseOptions:  # a base of an instance's class: read as the instance's
        width = 8

    class RunOptions(BaseOptions):
        depth = 2

    @dataclasses.dataclass(slots=True)
    class SlotConfig:
        lr: float = 0.5
        name: str = "slots"

    for kind in (TrainConfig, Settings, Runner, BaseOptions, RunOptions, SlotConfig):
        kind.__module__ = "__main__"
    namespace = {
        "cfg": TrainConfig(), "opts": types.SimpleNamespace(beta=0.9, name="adam"), "settings": Settings(),
        "runner": Runner(), "TrainConfig": TrainConfig, "_hidden": TrainConfig(), "BaseOptions": BaseOptions,
        "run": RunOptions(), "slot": SlotConfig(),
    }  # fmt: skip
    expected = {"cfg.lr": 0.1, "cfg.steps": 10, "opts.beta": 0.9, "opts.name": "adam", "run.width": 8,
                "run.depth": 2, "slot.lr": 0.5, "slot.name": "slots"}  # fmt: skip
    assert simple_globals(namespace) == expected


def test_a_dataclass_itself_is_no_configuration_its_instances_are() -> None:
    """HF's examples: `ModelArguments` is defined among the globals, its instance made inside main()
    from a JSON file. Its class attributes are the defaults, not what the run used (before: recorded
    as `ModelArguments.n_layer 1` where the run trained 2 layers)."""

    @dataclasses.dataclass
    class ModelArguments:
        n_layer: int = 1

    ModelArguments.__module__ = "__main__"
    assert simple_globals({"ModelArguments": ModelArguments, "steps": 3}) == {"steps": 3}
    args = ModelArguments(n_layer=2)
    assert simple_globals({"ModelArguments": ModelArguments, "args": args}) == {"args.n_layer": 2}


def test_a_named_tuple_configuration_is_read() -> None:
    """Left from the last stop: `class Hyperparameters(NamedTuple)` was not read (its `tuple` base
    counted as a library's). Its fields are read, an instance's values or the class's defaults; a
    named tuple that is no configuration (a point) is read as a dataclass instance would be."""
    from typing import NamedTuple

    class Hyperparameters(NamedTuple):
        lr: float = 3e-4
        batch: int = 8

    class Point(NamedTuple):
        x: int
        y: int

    class TrainConfig(collections.namedtuple("TrainConfigBase", "lr steps")):  # (from a review)
        pass

    for kind in (Hyperparameters, Point, TrainConfig, TrainConfig.__mro__[1]):
        kind.__module__ = "__main__"
    namespace = {"args": Hyperparameters(batch=16), "origin": Point(0, 1), "cfg": TrainConfig(0.1, 5)}
    assert simple_globals(namespace) == {
        "args.lr": 3e-4, "args.batch": 16, "origin.x": 0, "origin.y": 1, "cfg.lr": 0.1, "cfg.steps": 5}
    assert simple_globals({"Hyperparameters": Hyperparameters, "Point": Point}) == {
        "Hyperparameters.lr": 3e-4, "Hyperparameters.batch": 8}


def test_a_dict_that_collects_most_of_the_scripts_own_globals_is_the_configuration() -> None:
    namespace = {
        "lr": 0.002, "batch": 4, "accumulation": 5, "start": "\n",
        "arg": "--lr=0.002", "key": "lr",  # a configurator's loop variables
        # nanoGPT's: the values the user set (it divides the accumulation by the ranks afterwards)
        "config": {"lr": 0.002, "batch": 4, "accumulation": 40, "start": "\n"},
        "meta": {"vocab": 65, "lr": 0.002},  # holds a name that is no global: not a collection of them
    }  # fmt: skip
    assert simple_globals(namespace) == {"lr": 0.002, "batch": 4, "accumulation": 40, "start": "\n"}

    # a dict of a few globals (a model's arguments, a history of metrics) is not the configuration
    namespace["config"] = {"lr": 0.002, "batch": 4}
    assert simple_globals(namespace) == {"lr": 0.002, "batch": 4, "accumulation": 5, "arg": "--lr=0.002",
                                         "key": "lr"}  # fmt: skip


def test_credentials_in_a_list_of_globals_are_redacted() -> None:
    section = used_params({}, {"globals": {"servers": ["https://bob:hunter2@db.example/x", "local"]}})
    assert "hunter2" not in json.dumps(section) and section["values"]["servers"][1] == "local"


def test_a_value_json_cannot_write_is_left_out_of_the_childs_facts_and_later_saves_still_write(
    tmp_path: Path,
) -> None:
    """An int of thousands of digits (a script's global, an argparse default) made every later save
    of child.json fail: the trace header and the exit facts were lost."""
    facts = Facts(tmp_path / "child.json")
    facts.update(argparse={"steps": 10**5000})
    facts.update(globals={"lr": 0.1})
    assert json.loads((tmp_path / "child.json").read_text())["globals"] == {"lr": 0.1}
    assert "argparse" not in facts.data
