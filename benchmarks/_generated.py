"""Pages generated from committed result files: write them, or check that they are current."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(out: Path, text: str, repo: Path, command: str, check: bool) -> int:
    """Write `text` to `out` (0), or with `check` compare it (1 and a message naming `command` when the
    file is missing or differs)."""
    name = out.relative_to(repo)
    if check:
        if not out.is_file() or out.read_text() != text:
            print(f"{name} is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {name}")
    return 0
