"""``python -m kernelforge`` runs the CLI (useful where the console script is not on PATH)."""

from kernelforge.cli.entry import main

main()
