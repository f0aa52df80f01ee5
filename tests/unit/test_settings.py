"""cascade.yaml: every key of the wrong type or range is named with its value and what is expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro.errors import ConfigError
from cascade_repro.settings import load_settings


def settings_from(tmp_path: Path, text: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    (tmp_path / "cascade.yaml").write_text(text)
    return load_settings(tmp_path, env or {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metrics_flush_s: abc", "metrics_flush_s is 'abc'; expected a number of seconds > 0"),
        ("metrics_flush_s: 0", "metrics_flush_s is 0; expected a number of seconds > 0"),
        ("metrics_flush_s: .inf", "metrics_flush_s is inf; expected a number of seconds > 0"),
        ("metrics_flush_s: true", "metrics_flush_s is True; expected a number of seconds > 0"),
        ("key_metrics: 5", "key_metrics is 5; expected a list of metric names"),
        ("key_metrics: loss", "key_metrics is 'loss'; expected a list of metric names"),
        ("key_metrics: [loss, 3]", "key_metrics is ['loss', 3]; expected a list of metric names"),
        (
            "docker: 'yes'",
            "docker is 'yes'; expected a mapping of docker settings, e.g. `docker: {enab",
        ),
        ("docker: {enabled: 'yes'}", "docker.enabled is 'yes'; expected true or false"),
        ("trace_interval: -1", "trace_interval is -1; expected a whole number of steps >= 0 (0: no trace)"),
        ("trace_interval: 2.5", "trace_interval is 2.5; expected a whole number of steps >= 0"),
        ("trace_interval: often", "trace_interval is 'often'; expected a whole number of steps >= 0"),
        ("trace_budget: -0.1", "trace_budget is -0.1; expected a share of step time from 0 to 1"),
        ("trace_budget: 2", "trace_budget is 2; expected a share of step time from 0 to 1"),
        ("trace_budget: .nan", "trace_budget is nan; expected a share of step time from 0 to 1"),
        ("trace_budget: yes", "trace_budget is True; expected a share of step time from 0 to 1"),
        ("trace: partial", "trace is 'partial'; expected full (every facet every step)"),
        ("untracked_max_bytes: -5", "untracked_max_bytes is -5; expected a whole number of bytes >= 0"),
        ("untracked_max_bytes: 1MB", "untracked_max_bytes is '1MB'; expected a whole number of bytes >= 0"),
        ("env_allow_prefixes: CUDA_", "env_allow_prefixes is 'CUDA_'; expected a list of variable-name"),
        ("experiment: [a, b]", "experiment is ['a', 'b']; expected a text value"),
        ("tracking_uri: {a: 1}", "tracking_uri is {'a': 1}; expected a text value"),
        ("params_file: 5", "params_file is 5; expected a text value"),
        ("checkpoints_dir: true", "checkpoints_dir is True; expected a text value"),
        ("determinism: sometimes", "determinism is 'sometimes'; expected off, warn or strict"),
        ("determinism: on", "determinism is True; expected off, warn or strict"),
        ("trace_grads: sometimes", "trace_grads is 'sometimes'; expected true, false or auto"),
        ("log_checkpoints: maybe", "log_checkpoints is 'maybe'; expected true or false"),
        ("dvc: origin", "dvc is 'origin'; expected a mapping of dvc settings"),
        ("dvc: {remot: origin}", "unknown dvc setting(s) remot"),
        ("dvc: {remote: [a]}", "dvc.remote is ['a']; expected a text value"),
        ("checkpoints: 3", "checkpoints is 3; expected a mapping of checkpoints settings"),
        ("checkpoints: {mode: lowest}", "checkpoints.mode is 'lowest'; expected min or max"),
        ("checkpoints: {save_top_k: -2}", "checkpoints.save_top_k is -2; expected a whole number >= -1"),
        ("checkpoints: {save_last: 'no'}", "checkpoints.save_last is 'no'; expected true or false"),
        ("checkpoints: {monitor: 5}", "checkpoints.monitor is 5; expected a text value"),
        ("checkpoints: {keep: 1}", "unknown checkpoints setting(s) keep"),
    ],
)
def test_a_bad_value_names_file_key_value_and_the_expected(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from(tmp_path, text + "\n")
    assert str(info.value).startswith("cascade.yaml: ")
    assert message in str(info.value)
    assert str(tmp_path / "cascade.yaml") in str(info.value)  # the hint names the whole path


def test_the_template_and_good_values_load(tmp_path: Path) -> None:
    template = Path(__file__).parents[2] / "templates" / "cascade.yaml"
    settings = settings_from(tmp_path, template.read_text())
    assert (settings.determinism, settings.trace_interval, settings.metrics_flush_s) == ("warn", 1, 5.0)
    assert settings.trace_budget == 0.02
    assert settings_from(tmp_path, "trace: full\n").trace_budget == 0.0
    assert settings_from(tmp_path, "trace_budget: 0.1\n").trace_budget == 0.1
    assert settings.checkpoint_policy == {"mode": "min", "save_top_k": 3, "save_last": True}
    assert settings.docker == {"enabled": False} and settings.dvc_remote is None
    settings = settings_from(tmp_path, (
        "experiment: 2024\nmetrics_flush_s: 0.5\ntrace_interval: 0\nuntracked_max_bytes: 1e6\n"
        "key_metrics: [val_loss]\nenv_allow_prefixes: [MY_]\ndvc: {remote: origin}\n"
        "checkpoints: {save_top_k: -1, monitor: val_loss}\nlog_checkpoints: true\ntrace_grads: false\n"
    ))  # fmt: skip
    assert settings.experiment == "2024" and settings.metrics_flush_s == 0.5 and settings.trace_interval == 0
    assert settings.untracked_max_bytes == 1_000_000 and settings.key_metrics == ("val_loss",)
    assert settings.env_allow_prefixes == ("MY_",) and settings.dvc_remote == "origin"
    assert settings.checkpoint_policy == {"save_top_k": -1, "monitor": "val_loss"}
    assert settings.log_checkpoints is True and settings.trace_grads is False


def test_determinism_off_is_off_though_yaml_reads_it_as_false(tmp_path: Path) -> None:
    assert settings_from(tmp_path, "determinism: off\n").determinism == "off"
    assert settings_from(tmp_path, "determinism: strict\n").determinism == "strict"
    with pytest.raises(ConfigError, match="CASCADE_DETERMINISM is 'loose'; expected off, warn or strict"):
        settings_from(tmp_path, "", {"CASCADE_DETERMINISM": "loose"})


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://github.com/org/vision.git", "vision"),
        ("git@github.com:org/vision.git", "vision"),
        ("ssh://git@host:22/org/vision/", "vision"),
        ("/srv/git/vision", "vision"),
        ("", None),
    ],
)
def test_the_experiment_is_named_after_the_remote_repository(url: str, name: str | None) -> None:
    from cascade_repro.settings import repository_name

    assert repository_name(url) == name
