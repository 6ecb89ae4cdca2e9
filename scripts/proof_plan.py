"""Print the blocks and shapes of the proof's job files, one `JOB<TAB>BLOCK<TAB>SHAPES` line each.

scripts/gpu_check.sh reads it so that the baseline check and the search run at the same presets:
the job files are the one place where the proof's shapes are chosen.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def plan(paths: list[str]) -> list[tuple[str, str, str]]:
    """(job name, block id, shapes) of every block of every job file, in order."""
    rows = []
    for path in paths:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        name = data.get("job", {}).get("name", Path(path).stem)
        rows += [(name, b["id"], b.get("shapes", "smoke")) for b in data.get("blocks", [])]
    return rows


if __name__ == "__main__":
    for row in plan(sys.argv[1:]):
        print("\t".join(row))
