"""Errors a user (or a model) can cause. The CLI prints their message as one line, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in something the user gave us: a job file, a name, a parameter, a template.

    The message names the thing (file, field, parameter) and says how to fix it.
    """


class StorageError(UserError):
    """The results database (or a report) cannot be written or read as it must be (full disk,
    read-only file or folder, damaged file, lost server, a file deleted or replaced under a running
    search): one line naming the file and the fix; the CLI exits with status 1
    (:mod:`kernelforge.store.failures`)."""


class TemplateError(UserError):
    """A template that cannot be parsed, validated or rendered."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived (:mod:`kernelforge.cli.signals`; its number is ``args[0]``): stop
    as for Ctrl-C (every handler of KeyboardInterrupt applies), and exit with 128 + that number
    (143, 129) instead of 130."""
