"""Errors a user (or a model) can cause. The CLI prints their message as one line, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in something the user gave us: a job file, a name, a parameter, a template.

    The message names the thing (file, field, parameter) and says how to fix it.
    """


class TemplateError(UserError):
    """A template that cannot be parsed, validated or rendered."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (:mod:`kernelforge.cli.signals`): stop as for Ctrl-C (every handler of
    KeyboardInterrupt applies), and exit with 143 instead of 130."""
