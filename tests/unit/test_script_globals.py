"""A script configured by its module's globals (nanoGPT's way): which globals are its configuration."""

from __future__ import annotations

import math
import os
import time

from cascade_repro.child.script_globals import simple_globals


def test_simple_values_are_configuration_and_clock_readings_modules_and_private_names_are_not() -> None:
    namespace = {
        "__name__": "__main__", "_private": 1, "os": os, "main": simple_globals,
        "lr": 6e-4, "steps": 5000, "amp": True, "device": "cpu", "resume": None, "betas": (0.9, 0.95),
        "t0": time.time(), "started": time.perf_counter(), "begun": time.monotonic(), "ns": time.time_ns(),
        "long": list(range(500)), "nested": [[1]], "inf": math.inf, "max_time": 3600.0,
    }  # fmt: skip
    assert simple_globals(namespace) == {
        "lr": 6e-4, "steps": 5000, "amp": True, "device": "cpu", "resume": None, "betas": [0.9, 0.95],
        "inf": "inf", "max_time": 3600.0,
    }  # fmt: skip


def test_a_dict_that_collects_the_scripts_own_globals_names_the_configuration() -> None:
    lr, batch = 0.002, 4
    namespace = {
        "lr": lr, "batch": batch, "arg": "--lr=0.002", "key": "lr",  # a configurator's loop variables
        "config": {"lr": lr, "batch": batch},
        "meta": {"vocab": 65, "lr": lr},  # holds a name that is no global: not a collection of them
        "made_before": {"lr": 0.1, "batch": batch},  # the names; their values are the globals'
    }  # fmt: skip
    assert simple_globals(namespace) == {"lr": 0.002, "batch": 4}
    del namespace["made_before"]
    assert simple_globals(namespace) == {"lr": 0.002, "batch": 4}
    del namespace["config"]
    assert simple_globals(namespace) == {"lr": 0.002, "batch": 4, "arg": "--lr=0.002", "key": "lr"}
