"""The ``kernelforge`` command line.

User mistakes (unknown names, bad parameters, malformed files) print one line naming the thing and
the fix, and exit with status 2; a check that finds a failing shape exits with status 1, and so does
a results database that cannot be written or read (one line naming it and the fix:
:mod:`kernelforge.store.failures`).

No secret is printed: the group registers the values of environment variables with secret names
(:func:`kernelforge.redact.register_environment`; the job's key variable and storage password are
registered when they are read) and puts the redactor in front of stdout and stderr, so every line,
warning and traceback of every command is masked.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import click
from rich.markup import escape

from kernelforge.cli.backup import backup
from kernelforge.cli.check import check, compile_
from kernelforge.cli.common import err_console
from kernelforge.cli.inspect import blocks, new, render, shipped, templates
from kernelforge.cli.dashboard import dashboard
from kernelforge.cli.device import ceilings, crosscheck
from kernelforge.cli.report import export, report
from kernelforge.cli.search import search, strategy_bench
from kernelforge.cli.signals import install_stop_signals, restore_stop_signals, stop_status
from kernelforge.cli.show import show
from kernelforge.cli.tune import tune
from kernelforge.block import HarnessError
from kernelforge.errors import StorageError, UserError
from kernelforge.store.failures import storage_error
from kernelforge.redact import redact, redact_standard_streams, register_environment


class OneLineErrors(click.Group):
    """Turns UserError into one clear line and exit status 2, and Ctrl-C or SIGTERM at any moment
    (start-up included) into exit status 130 or 143 with nothing lost: every result is stored when
    it exists (:mod:`kernelforge.cli.signals`)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        previous = install_stop_signals()
        try:
            return self._main(args, prog_name, complete_var, standalone_mode, **extra)
        finally:
            restore_stop_signals(previous)

    def _main(self, args: Any, prog_name: str | None, complete_var: str | None, standalone_mode: bool,
              **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        # Click's standalone mode turns a KeyboardInterrupt outside the command (while parsing,
        # say) into "Aborted!" and exit status 1: handled here instead, with 130 or 143.
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort as exc:
            if isinstance(exc.__cause__, KeyboardInterrupt):
                err_console.print("kernelforge: interrupted")
                sys.exit(stop_status(exc.__cause__))
            err_console.print("Aborted!")
            sys.exit(1)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            err_console.print("kernelforge: interrupted")
            sys.exit(stop_status(exc))
        sys.exit(status if isinstance(status, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StorageError as exc:
            _one_line(exc)
            ctx.exit(1)
        except UserError as exc:
            _one_line(exc)
            ctx.exit(2)
        except HarnessError as exc:  # a block's own mistake (kernelforge.block): its author's to fix
            _one_line(UserError(f"the block's check is unsound: {exc}; fix the block (its block.py: "
                                "docs/block-contract.md)"))
            ctx.exit(2)
        except KeyboardInterrupt as exc:
            err_console.print("kernelforge: interrupted; everything measured is stored, rerun to continue")
            ctx.exit(stop_status(exc))
        except Exception as exc:
            # A database failure raised past the store's own hook (by Optuna's storage, say) is
            # still one line and status 1 (kernelforge.store.failures); anything else is a bug.
            failure = storage_error(exc)
            if failure is None:
                raise
            _one_line(failure)
            ctx.exit(1)


def _one_line(exc: UserError) -> None:
    # Escaped: messages name TOML tables such as [llm], which rich would take for markup.
    err_console.print(f"[bold red]kernelforge:[/] {escape(redact(str(exc)))}")


@click.group(cls=OneLineErrors)
@click.option("--kernels", type=click.Path(file_okay=False), envvar="KERNELFORGE_KERNELS",
              help="Kernels folder (default: kernels/ of this checkout).")
@click.pass_context
def main(ctx: click.Context, kernels: str | None) -> None:
    """kernelforge: find faster GPU kernels for the attention and MoE blocks of large models."""
    register_environment()
    redact_standard_streams()
    ctx.ensure_object(dict)
    ctx.obj["kernels"] = kernels


for command in (blocks, templates, render, new, show, check, compile_, search, strategy_bench, report, export,
                dashboard, ceilings, crosscheck, shipped, backup, tune):
    main.add_command(command)
