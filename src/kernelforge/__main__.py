"""``python -m kernelforge`` runs the CLI (useful where the console script is not on PATH)."""

from kernelforge.cli.main import main

main()
