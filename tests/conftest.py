"""The suite's shared helpers, fixtures and capability markers live in the plugin (tests/plugin.py)."""

pytest_plugins = ["tests.plugin", "pytester"]
