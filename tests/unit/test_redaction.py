"""Which argv values, environment values and URL parts are secrets, and how a restore fills them back."""

from __future__ import annotations

import pytest

from cascade_repro.redaction import (
    MARKER,
    fill_argv,
    redact_argv,
    redact_text,
    redact_variable,
    secret_option,
    secret_slots,
    secret_variable,
)


@pytest.mark.parametrize(
    ("argv", "recorded"),
    [
        (["--api-key=sk-1"], ["--api-key=<redacted>"]),
        (["--api-key", "sk-1"], ["--api-key", "<redacted>"]),
        (["--token", "sk-1", "--lr", "0.1"], ["--token", "<redacted>", "--lr", "0.1"]),
        (["--secret=s", "--client-secret", "s"], ["--secret=<redacted>", "--client-secret", "<redacted>"]),
        (["--password", "p", "--db-pass=p", "--dbPassword", "p"],
         ["--password", "<redacted>", "--db-pass=<redacted>", "--dbPassword", "<redacted>"]),
        (["--hf-token", "hf", "--authToken", "t", "--auth", "a"],
         ["--hf-token", "<redacted>", "--authToken", "<redacted>", "--auth", "<redacted>"]),
        (["--credentials", "c", "--slack-webhook-url", "https://hooks.slack.com/services/T/B/X"],
         ["--credentials", "<redacted>", "--slack-webhook-url", "<redacted>"]),
        (["api_key=k", "db.password=p", "+db.pass=p", "++auth.token=t", "SECRET_KEY=k"],
         ["api_key=<redacted>", "db.password=<redacted>", "+db.pass=<redacted>", "++auth.token=<redacted>",
          "SECRET_KEY=<redacted>"]),
        (["--data", "postgresql://u:pw@h/db", "src=https://u:p@ss@h/x"],
         ["--data", "postgresql://u:<redacted>@h/db", "src=https://u:<redacted>@h/x"]),
        (["https://h/x?a=1&access_token=t&b=2"], ["https://h/x?a=1&access_token=<redacted>&b=2"]),
    ],
)  # fmt: skip
def test_secret_values_in_argv_are_redacted(argv: list[str], recorded: list[str]) -> None:
    assert redact_argv(argv) == recorded
    assert redact_argv(recorded) == recorded  # a record can be redacted again without change


@pytest.mark.parametrize(
    "argv",
    [
        ["--keep", "3", "--monkey", "5", "--keys", "a,b"],
        ["--pad-token", "<pad>", "--eos-token=</s>", "--max-tokens", "512"],
        ["--api-key-file", "key.txt", "--token-budget", "9", "--passes", "2"],
        ["--no-auth", "train.csv", "--token", "--lr", "0.1"],  # a flag, and a value-less option
        ["ssh://git@github.com/o/r.git", "https://h/x?page=2", "lr=0.1", "-p", "8080"],
    ],
)
def test_ordinary_arguments_are_kept(argv: list[str]) -> None:
    assert redact_argv(argv) == argv


def test_option_names() -> None:
    secret = ["--api-key", "--apiKey", "KEY", "--db-pass", "PGPASSWORD", "db.password", "--sentry-dsn", "sig"]
    assert [n for n in secret if not secret_option(n)] == []
    plain = ["--keep", "--monkey", "--key-column", "--bypass", "--compass", "--author", "--pad-token"]
    assert [n for n in plain if secret_option(n)] == []


def test_access_tokens_and_private_keys_under_their_own_names() -> None:
    """A GitHub personal access token, a PEM private key, a database's pwd: secrets by these names
    too (a nanoGPT-style global `GITHUB_PAT = "ghp_..."` was recorded in the clear)."""
    secret = ["GITHUB_PAT", "--hf-pat", "gh_pat", "private_key_pem", "--private-key", "ssh_private_key",
              "signing_key_pem", "db_pwd", "--db-pwd", "--bearer", "bearer_token", "aws_secret_access_key",
              "--old-pwd", "--current-pwd"]
    assert [n for n in secret if not secret_option(n)] == []
    plain = ["--pat", "--pattern", "--pwd", "--private-key-file", "--private-key-path", "--cert-pem",
             "--pem-file", "--patience", "--spatial", "--exclude-pat", "--file-pat", "--glob-pat",
             "--public-key-pem", "args.pwd", "--start-pwd"]  # (from a review: patterns, a public key, a cwd)
    assert [n for n in plain if secret_option(n)] == []
    assert [n for n in ["GITHUB_PAT", "GH_PAT", "DB_PWD", "SIGNING_KEY_PEM"] if not secret_variable(n)] == []
    assert not secret_variable("PWD") and not secret_variable("OLDPWD") and not secret_variable("PATH")


def test_environment_names_and_values() -> None:
    secret = ["DB_PASS", "PGPASSWORD", "SENTRY_DSN", "SLACK_WEBHOOK_URL", "HF_TOKEN", "AWS_REGION", "API_KEY"]
    assert [n for n in secret if not secret_variable(n) or redact_variable(n, "v") != MARKER] == []
    assert not secret_variable("OMP_NUM_THREADS") and not secret_variable("CUDA_VISIBLE_DEVICES")
    assert redact_variable("DATABASE_URL", "postgresql://u:secret@h/db") == "postgresql://u:<redacted>@h/db"
    assert (
        redact_variable("DATA", "s3://b/k?X-Amz-Signature=abc&x=1")
        == "s3://b/k?X-Amz-Signature=<redacted>&x=1"
    )
    assert redact_text("see postgresql://u:pw@h/db and more") == "see postgresql://u:<redacted>@h/db and more"
    assert redact_variable("HOME_URL", "https://git@h/x") == "https://git@h/x"


def test_restore_names_one_variable_per_redacted_value_and_fills_them() -> None:
    recorded = redact_argv(
        ["--api-key=sk-1", "--token", "sk-2", "db.password=p", "https://u:pw@h/x?token=t", "--lr", "0.1"]
    )
    slots = secret_slots(recorded)
    assert [(s.position, s.option, s.variable) for s in slots] == [
        (0, "--api-key", "CASCADE_SECRET_API_KEY"),
        (2, "--token", "CASCADE_SECRET_TOKEN"),
        (3, "db.password", "CASCADE_SECRET_DB_PASSWORD"),
        (4, "argument 5", "CASCADE_SECRET_ARGUMENT_5"),
        (4, "argument 5", "CASCADE_SECRET_ARGUMENT_5_2"),
    ]
    values = {s.variable: f"v{i}" for i, s in enumerate(slots)}
    filled, missing = fill_argv(recorded, values)
    assert filled == [
        "--api-key=v0", "--token", "v1", "db.password=v2", "https://u:v3@h/x?token=v4", "--lr", "0.1",
    ]  # fmt: skip
    assert missing == []
    del values["CASCADE_SECRET_ARGUMENT_5"]
    filled, missing = fill_argv(recorded, values)
    assert filled[4] == "https://u:<redacted>@h/x?token=v4" and missing == ["CASCADE_SECRET_ARGUMENT_5"]


def test_camel_case_names_are_read_word_by_word() -> None:
    """`--dbPwd` and `--githubPat` were recorded in the clear (one word, "dbpwd", to the rules), and
    `--padToken`, a tokenizer's token, was redacted: a camelCase name is split into its words as a
    kebab-case one is."""
    secret = ["--dbPwd", "--githubPat", "dbPwd", "hfPat", "--apiKey", "--hfToken", "privateKeyPem",
              "--dbPassword", "--accessToken", "--slackWebhookUrl", "--DB_PWD", "--APIKey",
              # (from a review: compounds the words split apart, secret as one word before)
              "--passPhrase", "--sshPassPhrase", "--webHook", "--slackWebHook", "--passWord", "--PassWd"]
    assert [n for n in secret if not secret_option(n)] == []
    plain = ["--padToken", "--eosToken", "--excludePat", "--keyFile", "--privateKeyPath", "--publicKeyPem",
             "--startPwd", "--maxPatience", "--useAuthorName", "--PWD", "--PAT",
             # (from a review: a camelCase word is not a secret's name on its own, nor is a flag)
             "--sortKey", "--textKey", "--labelKey", "--byPass", "--firstPass", "--useHTTPAuth", "--noAuth"]
    assert [n for n in plain if secret_option(n)] == []
    assert redact_argv(["--byPass", "data.csv"]) == ["--byPass", "data.csv"]
    assert redact_argv(["train.py", "--dbPwd", "hunter2", "--githubPat=ghp_x"]) == [
        "train.py", "--dbPwd", MARKER, f"--githubPat={MARKER}"]
