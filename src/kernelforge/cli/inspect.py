"""Commands that look at the catalog: ``blocks``, ``shipped``, ``templates``, ``render`` and ``new``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from kernelforge.cli.common import catalog_of, console, parse_params
from kernelforge.errors import UserError


@click.command()
@click.pass_context
def blocks(ctx: click.Context) -> None:
    """List the blocks and their shape sets."""
    catalog = catalog_of(ctx)
    table = Table(title="blocks")
    for column in ("block", "family", "shape sets", "description"):
        table.add_column(column)
    for block_id, block in catalog.blocks.items():
        sets = ", ".join(f"{name} ({len(shapes)})" for name, shapes in block.shape_sets().items())
        table.add_row(block_id, block.family, sets, block.description)
    console.print(table)
    console.print("what serving engines run for each block, and the library line: kernelforge shipped [BLOCK]",
                  markup=False)
    not_loaded(ctx, [str(error) for error in catalog.broken_blocks.values()], "blocks")


def not_loaded(ctx: click.Context, problems: list[str], what: str) -> None:
    """After a listing: each file that did not load with its error, and exit status 1 (none: nothing)."""
    if problems:
        console.print()
        console.print(f"not loaded: every command that uses these {what} stops on them until they are fixed\n"
                      + "\n".join(f"  {problem}" for problem in problems), markup=False)
        ctx.exit(1)


@click.command()
@click.argument("block_id", required=False)
@click.pass_context
def templates(ctx: click.Context, block_id: str | None) -> None:
    """List the templates (of one block, or all) with their spaces and baseline points.

    Below the table, each template's space: every parameter with its values (the baseline value
    in brackets) and the constraints a point must satisfy; for a baseline template, where its
    [baseline] point comes from and its per-shape [[baselines]] rules, each with its source.
    """
    catalog = catalog_of(ctx)
    table = Table(title="templates")
    for column in ("template", "role", "origin", "points", "valid", "baseline point"):
        table.add_column(column)
    listings = [catalog.listing(b) for b in ([block_id] if block_id else catalog.blocks)]
    chosen = [template for listing in listings for template in listing.loaded]
    for template in chosen:
        point = " ".join(f"{k}={v}" for k, v in template.baseline.items())
        valid, exact = template.space.valid_count()
        table.add_row(template.id, template.role, template.origin, str(template.space.size),
                      str(valid) if exact else f"~{valid} (sampled)", point)
    console.print(table)
    for template in chosen:
        console.print()
        console.print("\n".join(space_lines(template)), markup=False)
    problems = [str(error) for listing in listings for error in listing.broken.values()]
    problems += [problem for listing in listings if (problem := listing.baseline_problem())
                 and not listing.broken]  # with broken files, theirs are the errors to fix first
    problems += [str(error) for error in catalog.broken_blocks.values()] if not block_id else []
    not_loaded(ctx, problems, "templates")


def space_lines(template) -> list[str]:
    """A template's space as text: one line per parameter, then its constraints."""
    lines = [f"{template.id}" + (f": {template.description}" if template.description else "")]
    width = max(len(name) for name in template.space.names)
    for name, values in template.space.params:
        cells = [f"[{v}]" if is_baseline(template, name, v) else str(v) for v in values]
        lines.append(f"  {name.ljust(width)}  {', '.join(cells)}")
    constraints = [c.text for c in template.space.constraints]
    lines.append("  constraints: " + ("; ".join(constraints) if constraints else "none"))
    if template.body_of:
        lines.append(f"  body: {template.body_of}'s")
    if template.ties:
        lines.append("  ties (not searched): " + ", ".join(f"{k} = {v}" for k, v in template.ties.items()))
    if template.role == "baseline":
        lines.append(f"  baseline source: {template.baseline_source}")
        if template.baseline_rules:
            lines.append("  per-shape baselines (the first rule whose `when` holds; else [baseline]):")
            lines.extend(f"    {rule.describe()}" for rule in template.baseline_rules)
    return lines


def is_baseline(template, name: str, value) -> bool:
    """Whether ``value`` is the baseline's value of ``name`` (``True`` is not ``1`` here)."""
    base = template.baseline.get(name)
    return type(base) is type(value) and base == value


@click.command()
@click.argument("template_id")
@click.argument("params", nargs=-1)
@click.pass_context
def render(ctx: click.Context, template_id: str, params: tuple[str, ...]) -> None:
    """Print TEMPLATE rendered at its baseline point, with PARAM=VALUE overrides."""
    template = catalog_of(ctx).resolve(template_id)
    point = {**template.baseline, **parse_params(params)}
    click.echo(template.render(point), nl=False)



@click.command()
@click.argument("name")
@click.option("--header-only", is_flag=True,
              help="A header over the baseline's body ([template] body), for another space, other ties or "
                   "constraints of the same kernel, instead of a copy of the kernel to edit.")
@click.pass_context
def new(ctx: click.Context, name: str, header_only: bool = False) -> None:
    """Scaffold template BLOCK/NAME from the block's baseline, ready to edit."""
    from kernelforge.scaffold import variant_text
    from kernelforge.template import TEMPLATE_SUFFIX, Template

    catalog = catalog_of(ctx)
    block_id, _, stem = name.rpartition("/")
    if name in catalog.blocks:
        raise UserError(f"new {name}: NAME is missing; give the new template's name after the block: "
                        f"{catalog.command(f'new {name}/NAME')}")
    catalog.block(block_id)
    if not stem.isidentifier():
        raise UserError(f"template name {stem!r} must be a Python identifier (letters, digits, _), e.g. {block_id}/wide_tiles")
    path = Path(catalog.root) / block_id / f"{stem}{TEMPLATE_SUFFIX}"
    if path.exists():
        raise UserError(f"{path} already exists; choose another name or edit it")
    baseline = catalog.baseline(block_id)
    path.write_text(variant_text(baseline, header_only=header_only), encoding="utf-8")
    try:
        Template.from_file(path, block_id)  # the scaffold must be valid as written
    except UserError:
        path.unlink()  # written just now: leave nothing invalid behind
        raise
    holder = f"{block_id}/{baseline.body_of}" if baseline.body_of else baseline.id  # no chains: who holds the body
    what = f"a header over {holder}'s body" if header_only else f"a copy of {baseline.id}"
    console.print(f"created [bold]{path}[/] ({what}, role = variant)")
    edit = "its [space], [ties] or constraints" if header_only else "it"
    check = catalog.command(f"check {block_id}/{stem} --device interpret --shapes smoke")
    console.print(f"next: edit {edit}, then `{check}`", markup=False)



@click.command()
@click.argument("block_id", required=False)
@click.pass_context
def shipped(ctx: click.Context, block_id: str | None) -> None:
    """What serving engines run for each block on Hopper, per preset family: the shipped path and
    its source, whether the Triton baseline is that path (so a speedup is "over experts"), and the
    library reference with whether it can run on the GPU image, and why not."""
    catalog = catalog_of(ctx)
    chosen = [catalog.block(block_id)] if block_id else list(catalog.blocks.values())
    for block in chosen:
        console.print(f"\n{block.id}", markup=False, style="bold")
        if not block.shipped:
            console.print("  no shipped path declared: speedups are over the Triton baseline", markup=False)
        for path in block.shipped:
            tokens = f", T {path.tokens[0]}-{path.tokens[1] if path.tokens[1] < 1 << 30 else 'up'}" if path.tokens else ""
            lines = [f"  presets {path.presets}{tokens}{'' if path.served else ' (not served)'}",
                     f"    shipped:   {path.engine}: {path.path}",
                     f"    source:    {path.source}",
                     "    baseline:  " + ("the shipped path or as strong: speedups are over experts"
                                          if path.baseline_is_expert else f"{path.baseline_is} (not the shipped path)"),
                     f"    library:   {path.library_status}"]
            console.print("\n".join(lines), markup=False, soft_wrap=True)
