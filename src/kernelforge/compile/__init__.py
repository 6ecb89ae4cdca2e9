"""Ahead-of-time compilation of candidates for GPU targets, without a GPU."""
