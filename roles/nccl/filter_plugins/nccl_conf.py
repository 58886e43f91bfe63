"""Filter `nccl_env_to_conf`: the NCCL settings of a rendered nccl_env.sh as /etc/nccl.conf entries.

nccl_env.sh is rendered from the ONE template lcm_runner/templates/nccl_env.sh.j2; /etc/nccl.conf carries
the same decisions by reading that rendered script instead of re-deciding them from the spec.
Understood lines: `export NAME=value`, `export NAME="value"`, `export NAME='value'` and the default form
`export NAME="${NAME:-value}"` (value = the default). Only NCCL_* names go to nccl.conf (NCCL reads no
other names there). A value that needs the shell at run time ($(...), `...`, another $VAR) cannot be
written to nccl.conf: it is reported in `runtime_only` and stays in nccl_env.sh alone.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

_EXPORT = re.compile(r"^\s*export\s+(NCCL_[A-Z0-9_]+)=(.*?)\s*$")
_DEFAULT = re.compile(r"^\$\{(NCCL_[A-Z0-9_]+):?[-=](.*)\}$")
_VALID_VALUE = re.compile(r"^[^\n\r]*$")


class NcclConfError(ValueError):
    """A line of nccl_env.sh that looks like an NCCL export but cannot be read."""


def parse_nccl_env(text: str) -> dict[str, Any]:
    """Return {"entries": {NAME: value}, "runtime_only": [NAME, ...]} for the NCCL exports in `text`."""
    entries: dict[str, str] = {}
    runtime_only: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        match = _EXPORT.match(line)
        if not match:
            continue
        name, raw = match.group(1), match.group(2)
        try:
            words = shlex.split(raw, comments=True, posix=True)
        except ValueError as exc:
            raise NcclConfError(f"nccl_env.sh line {lineno}: cannot parse {line.strip()!r}: {exc}") from exc
        if len(words) > 1:
            raise NcclConfError(f"nccl_env.sh line {lineno}: {name} has an unquoted value with spaces")
        value = words[0] if words else ""
        if raw.startswith("'"):
            entries[name] = value
            runtime_only = [n for n in runtime_only if n != name]
            continue
        default = _DEFAULT.match(value)
        if default and default.group(1) == name:
            value = default.group(2)
        if "$" in value or "`" in value:
            runtime_only.append(name)
            entries.pop(name, None)
            continue
        if not _VALID_VALUE.match(value):
            raise NcclConfError(f"nccl_env.sh line {lineno}: {name} value spans lines")
        entries[name] = value
        runtime_only = [n for n in runtime_only if n != name]
    return {"entries": entries, "runtime_only": sorted(set(runtime_only))}


def ifname_unmatched(socket_ifname: str, interfaces: list[str]) -> list[str]:
    """Entries of an NCCL_SOCKET_IFNAME value that select no interface in `interfaces`.

    NCCL's syntax: comma-separated prefixes (`eth` matches eth0), `=name` for an exact name, and a leading
    `^` to exclude the listed prefixes (an exclusion list selects "anything else": never unmatched).
    """
    value = (socket_ifname or "").strip()
    if not value or value.startswith("^"):
        return []
    exact = value.startswith("=")
    entries = [e.strip() for e in value.lstrip("=").split(",") if e.strip()]
    unmatched = []
    for entry in entries:
        found = entry in interfaces if exact else any(i.startswith(entry) for i in interfaces)
        if not found:
            unmatched.append(("=" if exact else "") + entry)
    return unmatched


def conf_mismatch(entries: dict[str, str], sourced: dict[str, str]) -> list[str]:
    """Names whose nccl.conf value differs from the value a shell sourcing nccl_env.sh ends up with."""
    return sorted(name for name, value in entries.items() if sourced.get(name) != value)


def nccl_env_to_conf(text: str) -> dict[str, Any]:
    try:
        return parse_nccl_env(text)
    except NcclConfError as exc:
        from ansible.errors import AnsibleFilterError

        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nccl_env_to_conf": nccl_env_to_conf,
            "nccl_ifname_unmatched": ifname_unmatched,
            "nccl_conf_mismatch": conf_mismatch,
        }
