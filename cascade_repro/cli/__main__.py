"""`python -m cascade_repro.cli`: the same as the `cascade` command."""

from cascade_repro.cli import main

main()
