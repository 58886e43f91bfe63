"""Safe host names, names and paths: spec and run-config values that become shell words and file paths.

Each check returns None for a good value, else the `expected` text of a SpecError (or a run-config problem)
that says what is wrong, so a hostile value is refused before anything runs, with its reason:

    path_problem("/shared/../etc")  ->  "an absolute, normalised path ...: '..' components are not allowed"

Paths: absolute, normalised (no `.` or `..` component, no `//`, no trailing `/` except `/` itself) and
made of letters, digits and `. _ + @ -` only: no spaces, control characters or shell metacharacters, no
`:` (the SRC:DST separator of container mounts) and no `,` (the separator of mount lists). PATH_PATTERN
says the same as a regular expression; schema.yml uses it for every path field (`x-safe: path`).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

PATH_CHARS = "A-Za-z0-9._+@-"
PATH_PATTERN = r"^(/|(/(?!\.\.?(/|$))[A-Za-z0-9._+@-]+)+)$"
PATH_EXPECTED = "an absolute, normalised path of letters, digits and . _ + @ - only"

_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*")
HOST_EXPECTED = (
    "an RFC 1123 host name (labels of 1-63 letters, digits or '-', not starting or ending with '-', "
    "joined by '.'; at most 253 characters)"
)

# A Slurm partition name (the spec's slurm.partitions[].name pattern; the run config's partition too).
PARTITION_RE = re.compile(r"[a-z][a-z0-9_-]*")
# A command name without a directory (the run config's python: python3) or an absolute path.
COMMAND_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")

_PATH_CHAR = re.compile(f"[/{PATH_CHARS}]")
_HOST_CHAR = re.compile(r"[A-Za-z0-9.-]")


def _bad_chars(value: str, allowed: re.Pattern[str]) -> list[str]:
    """The characters of value outside `allowed`, each once, in order."""
    seen: list[str] = []
    for ch in value:
        if not allowed.fullmatch(ch) and ch not in seen:
            seen.append(ch)
    return seen


def _show(chars: list[str]) -> str:
    """Characters as repr, so a space, a newline or a quote is visible: ' ', '\\n', '"'."""
    return ", ".join(repr(c) for c in chars)


def path_problem(value: object) -> str | None:
    """None for a safe absolute path, else what is expected and why this value is not it."""
    if not isinstance(value, str):
        return f"{PATH_EXPECTED}: got a {type(value).__name__}"
    if value == "/":
        return None
    why: list[str] = []
    if not value.startswith("/"):
        why.append("it is relative (it must start with '/')" if value else "it is empty")
    bad = _bad_chars(value, _PATH_CHAR)
    control = [c for c in bad if not c.isprintable()]
    if control:
        why.append(f"control characters are not allowed ({_show(control)})")
    other = [c for c in bad if c.isprintable()]
    if other:
        why.append(f"characters {_show(other)} are not allowed")
    parts = value.split("/")[1:] if value.startswith("/") else value.split("/")
    if ".." in parts:
        why.append("'..' components are not allowed")
    if "." in parts:
        why.append("'.' components are not allowed")
    if "//" in value:
        why.append("'//' is not allowed")
    if len(value) > 1 and value.endswith("/"):
        why.append("a trailing '/' is not allowed")
    return f"{PATH_EXPECTED}: {'; '.join(why)}" if why else None


def path_inside(path: str, root: str) -> bool:
    """path is root or below it; False unless both are safe paths (so `..` can never climb out)."""
    if path_problem(path) or path_problem(root):
        return False
    p, r = PurePosixPath(path), PurePosixPath(root)
    return p == r or r in p.parents


def host_problem(name: object) -> str | None:
    """None for an RFC 1123 host name, else what is expected and why this name is not one."""
    if not isinstance(name, str):
        return f"{HOST_EXPECTED}: got a {type(name).__name__}"
    if HOST_RE.fullmatch(name) and len(name) <= 253:
        return None
    why: list[str] = []
    if not name:
        why.append("it is empty")
    if name.startswith("-"):
        why.append("a leading '-' is not allowed (it would read as a command-line option)")
    bad = _bad_chars(name, _HOST_CHAR)
    if bad:
        why.append(f"characters {_show(bad)} are not allowed")
    if len(name) > 253:
        why.append(f"it has {len(name)} characters")
    labels = name.split(".")
    if name and any(not label for label in labels):
        why.append("empty labels ('..', or a leading or trailing '.') are not allowed")
    long = [label for label in labels if len(label) > 63]
    if long:
        why.append(f"labels are at most 63 characters ({len(long[0])} in {long[0][:16]!r}...)")
    edge = [label for label in labels if label and (label[0] == "-" or label[-1] == "-")]
    if edge and not name.startswith("-"):
        why.append(f"a label may not start or end with '-' ({edge[0]!r})")
    return f"{HOST_EXPECTED}: {'; '.join(why) or 'not a host name'}"


# The node's own directories: a shared mount on one of them, or node-local scratch or an NFS export in or
# below the first group, replaces or mixes with the system's files.
SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr",
)  # fmt: skip
SYSTEM_MOUNTS = ("/opt", "/root", "/run", "/tmp", "/var", "/var/cache", "/var/lib", "/var/log", "/var/tmp")


def system_path_problem(path: str) -> str | None:
    """None unless path is a system directory (SYSTEM_MOUNTS) or in or below one of SYSTEM_DIRS."""
    inside = next((d for d in SYSTEM_DIRS if path_inside(path, d)), None)
    if inside or path in SYSTEM_MOUNTS:
        where = f"inside {inside}" if inside and inside != path else "a system directory"
        return (
            f"a directory of its own, not {where} (the node's system files would be hidden or mixed in); "
            f"not in {', '.join(SYSTEM_DIRS)} and not one of {', '.join(SYSTEM_MOUNTS)}"
        )
    return None
