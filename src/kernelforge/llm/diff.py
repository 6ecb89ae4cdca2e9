"""Diff edits: an answer that changes its parent's template with search/replace blocks instead of
repeating all of it, in the conflict-marker format aider and OpenEvolve use::

    <<<<<<< SEARCH
    exact lines of the parent template
    =======
    replacement lines
    >>>>>>> REPLACE

An answer may hold several blocks, inside or outside a code fence, with prose around them. The
blocks apply in order, each to the text the earlier ones left. A SEARCH section must match whole
lines of that text exactly once (trailing whitespace and CRLF line ends aside); an empty SEARCH is
refused unless the parent is empty. Every failure is an :class:`EditFailure` whose message tells
the model what to change in its next answer.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from enum import Enum

_SEARCH = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*$")
_DIVIDER = re.compile(r"^[ \t]*={5,9}[ \t]*$")
_REPLACE = re.compile(r"^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$")
_ANY_MARKER = re.compile(r"^[ \t]*(<{5,9}[ \t]*SEARCH|>{5,9}[ \t]*REPLACE)[ \t]*$", re.MULTILINE)

#: How many of the parent's lines a "not found" message shows at most.
CLOSEST_LINES = 8


class EditError(str, Enum):
    """Why an edit could not be applied."""

    MALFORMED = "malformed"  # a block lacks its ======= or >>>>>>> REPLACE line
    EMPTY_SEARCH = "empty_search"  # an empty SEARCH section against a non-empty parent
    NOT_FOUND = "not_found"  # a SEARCH section matches no lines of the parent
    AMBIGUOUS = "ambiguous"  # a SEARCH section matches more than once
    NO_CHANGE = "no_change"  # the blocks leave the parent as it was

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class EditBlock:
    """One search/replace block: its sections as lines (no line ends) and the line of the answer
    its ``<<<<<<< SEARCH`` marker is on (1-based)."""

    search: tuple[str, ...]
    replace: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class EditFailure:
    """An edit that cannot be applied: ``block`` is the 1-based number of the block at fault
    (None when the fault is not one block's), ``message`` what to do about it."""

    error: EditError
    message: str
    block: int | None = None

    @property
    def ok(self) -> bool:
        return False


@dataclass(frozen=True)
class AppliedEdit:
    """An edit applied: the new ``text``, the unified ``diff`` of parent to new text (for storage
    and prompts) and how many ``blocks`` it held."""

    text: str
    diff: str
    blocks: int

    @property
    def ok(self) -> bool:
        return True


def has_edit_blocks(text: str) -> bool:
    """Whether ``text`` holds a search/replace marker (a SEARCH or a REPLACE line), so that it is
    meant as a diff edit (even a malformed one) rather than a whole template."""
    return _ANY_MARKER.search(text) is not None


def parse_blocks(text: str) -> tuple[EditBlock, ...] | EditFailure:
    """The search/replace blocks of an answer, in order; fence lines and prose between blocks are
    ignored. A block without its divider or REPLACE line is an :class:`EditFailure`."""
    lines = _lines(text)
    blocks: list[EditBlock] = []
    i = 0
    while i < len(lines):
        if _REPLACE.match(lines[i]):
            return EditFailure(EditError.MALFORMED, f"line {i + 1} of the answer is a >>>>>>> REPLACE line with no "
                                                    "<<<<<<< SEARCH line before it; every block is <<<<<<< SEARCH, "
                                                    "the exact parent lines, =======, the new lines, "
                                                    ">>>>>>> REPLACE", len(blocks) + 1)
        if not _SEARCH.match(lines[i]):
            i += 1
            continue
        number, start = len(blocks) + 1, i
        sections: list[list[str]] = [[]]
        i += 1
        while i < len(lines) and not _REPLACE.match(lines[i]) and not _SEARCH.match(lines[i]):
            if _DIVIDER.match(lines[i]) and len(sections) == 1:
                sections.append([])
            else:
                sections[-1].append(lines[i])
            i += 1
        missing = "=======" if len(sections) == 1 else (
            ">>>>>>> REPLACE" if i >= len(lines) or not _REPLACE.match(lines[i]) else None)
        if missing:
            return EditFailure(EditError.MALFORMED, f"block {number} (line {start + 1} of the answer) has no "
                                                    f"{missing} line; every block is <<<<<<< SEARCH, the exact "
                                                    "parent lines, =======, the new lines, >>>>>>> REPLACE", number)
        blocks.append(EditBlock(tuple(sections[0]), tuple(sections[1]), start + 1))
        i += 1
    return tuple(blocks)


def apply_blocks(parent: str, blocks: tuple[EditBlock, ...]) -> AppliedEdit | EditFailure:
    """Apply ``blocks`` in order to ``parent`` (see the module docstring)."""
    original = _lines(parent)
    trailing_newline = parent.endswith(("\n", "\r"))
    current = list(original)
    for number, block in enumerate(blocks, 1):
        where = _where(number, len(blocks))
        if not block.search:
            if current:
                return EditFailure(EditError.EMPTY_SEARCH, f"{where} has an empty SEARCH section: copy into it the "
                                                           "exact lines of the parent template that the block "
                                                           "replaces (or answer with the complete template)", number)
            current = list(block.replace)
            continue
        found = _find(current, block.search)
        if not found:
            return EditFailure(EditError.NOT_FOUND, _not_found(where, number, current, block.search), number)
        if len(found) > 1:
            shown = ", ".join(str(f + 1) for f in found[:6])
            return EditFailure(EditError.AMBIGUOUS, f"{where}: its SEARCH text occurs {len(found)} times in the "
                                                    f"parent template (at lines {shown}); add a few of the lines "
                                                    "around it to the SEARCH and REPLACE sections so that it matches "
                                                    "exactly once", number)
        at = found[0]
        current[at:at + len(block.search)] = block.replace
    if current == original:
        return EditFailure(EditError.NO_CHANGE, "the edit changes nothing: each REPLACE section must hold the new "
                                                "lines, different from its SEARCH section")
    text = "\n".join(current) + ("\n" if trailing_newline or not parent else "")
    return AppliedEdit(text, unified_diff(parent, text), len(blocks))


def apply_edit(parent: str, answer: str) -> AppliedEdit | EditFailure:
    """Parse the blocks of ``answer`` and apply them to ``parent``."""
    blocks = parse_blocks(answer)
    if isinstance(blocks, EditFailure):
        return blocks
    if not blocks:
        return EditFailure(EditError.MALFORMED, "the answer holds no complete <<<<<<< SEARCH / ======= / "
                                                ">>>>>>> REPLACE block")
    return apply_blocks(parent, blocks)


def unified_diff(parent: str, new: str, *, parent_name: str = "parent", new_name: str = "new") -> str:
    """The unified diff of ``parent`` to ``new`` (empty when they are the same)."""
    return "".join(difflib.unified_diff(_lines(parent, keepends=True), _lines(new, keepends=True),
                                        fromfile=parent_name, tofile=new_name))


def _lines(text: str, *, keepends: bool = False) -> list[str]:
    """Lines of ``text`` with CRLF and CR line ends read as LF."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not keepends:
        return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []
    out = text.splitlines(keepends=True)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"  # so that difflib's output stays one line per line
    return out


def _find(lines: list[str], search: tuple[str, ...]) -> list[int]:
    """Where ``search`` matches whole lines: exactly when it does anywhere, else ignoring trailing
    whitespace (models drop or add it)."""
    n = len(search)
    starts = range(len(lines) - n + 1)
    exact = [i for i in starts if tuple(lines[i:i + n]) == search]
    if exact:
        return exact
    stripped = tuple(s.rstrip() for s in search)
    return [i for i in starts if tuple(x.rstrip() for x in lines[i:i + n]) == stripped]


def _where(number: int, total: int) -> str:
    return f"block {number} of {total}" if total > 1 else "block 1"


def _not_found(where: str, number: int, lines: list[str], search: tuple[str, ...]) -> str:
    first = next((s for s in search if s.strip()), search[0])
    message = (f"{where}: its SEARCH text was not found in the parent template (first line searched: "
               f"{first.strip()!r})")
    if number > 1:
        message += "; the blocks apply in order, so the earlier blocks' REPLACE lines are already in place"
    closest = _closest(lines, search)
    if closest:
        message += ". The closest lines of the parent template:\n" + "\n".join(
            f"{at + 1:4d}| {lines[at]}" for at in closest)
    return message + ("\nCopy the SEARCH lines exactly from the parent template (indentation included), "
                      "or answer with the complete template.")


def _closest(lines: list[str], search: tuple[str, ...]) -> range:
    """The window of the parent's lines most like ``search`` (difflib's ratio), at most
    :data:`CLOSEST_LINES` long."""
    if not lines:
        return range(0)
    n = min(len(search), len(lines), CLOSEST_LINES)
    wanted = "\n".join(s.strip() for s in search[:n])
    best, best_ratio = 0, -1.0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(wanted)
    for i in range(len(lines) - n + 1):
        matcher.set_seq1("\n".join(x.strip() for x in lines[i:i + n]))
        if matcher.quick_ratio() <= best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best, best_ratio = i, ratio
    return range(best, best + n) if best_ratio > 0.3 else range(0)
