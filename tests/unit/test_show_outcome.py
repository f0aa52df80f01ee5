"""`cascade show`'s command and outcome rows, from records as they come (a shared server's too)."""

from __future__ import annotations

from cascade_repro.render.runs import _command, _exit


def test_the_outcome_names_a_signal_the_script_caught() -> None:
    """Found on word_language_model, which catches Ctrl-C and ends itself: show said "exit 0" alone and
    only `--json` had `signal: 2`."""
    assert _exit(0, "", 2) == "exit 0 (SIGINT reached the script, which caught it and ended itself)"
    assert _exit(143, "", 15) == "exit 143 (SIGTERM reached the script)"
    assert _exit(0, "", None) == "exit 0"
    assert _exit(1, "", 999) == "exit 1 (signal 999 reached the script)"
    assert _exit(1, "", "2; rm -rf /") == "exit 1"  # (not a number: not shown)
    assert _exit(None, "recovered") == "no exit code seen (the cascade process died first)"


def test_the_command_is_the_one_typed_and_pastes() -> None:
    typed = {"invocation": ["cascade", "run", "--seed", "7", "main.py", "--seed", "5", "--name", "a b"],
             "script": "main.py", "argv": ["--seed", "5"]}  # fmt: skip
    assert _command(typed) == "cascade run --seed 7 main.py --seed 5 --name 'a b'"
    older = {"script": "main.py", "argv": ["--epochs", "2"]}  # a record from before `invocation`
    assert _command(older) == "cascade run main.py --epochs 2"
    assert _command({"invocation": "cascade run x", "script": "main.py"}) == "cascade run main.py"


def test_an_argument_with_a_newline_is_shown_on_one_line_and_still_pastes() -> None:
    """Left from an earlier stop: shlex.join quotes a newline as it is, so `show`'s command row broke
    over two lines (and a record's control characters reached the table)."""
    invocation = ["cascade", "run", "gen.py", "--prompt", "Once upon\na time", "--sep", "\t", "it's"]
    typed = {"invocation": invocation}
    shown = _command(typed)
    assert shown == "cascade run gen.py --prompt $'Once upon\\na time' --sep $'\\t' 'it'\"'\"'s'"
    assert "\n" not in shown and "\t" not in shown
    import subprocess

    echoed = subprocess.run(["bash", "-c", f"printf '%s\\0' {shown}"], capture_output=True, check=True).stdout
    assert echoed.decode().split("\0")[:-1] == invocation  # bash reads back what was typed
