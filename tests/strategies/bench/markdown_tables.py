"""Reading Markdown tables back, for the tests of what the bench and its README print."""

from __future__ import annotations


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each Markdown table of ``text``: its rows (the header and the ``|---|`` line included), each a
    list of stripped cells."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def section(text: str, title: str) -> str:
    """The part of ``text`` from the '## ' heading that starts with ``title`` to the next one."""
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]
