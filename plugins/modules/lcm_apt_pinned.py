#!/usr/bin/python
"""Install Debian packages at exact versions and hold them, in one module run (roles/_packages).

The role used to do this in a dozen tasks per call (package_facts, a dpkg_selections loop to release
holds, a stat and two files for policy-rc.d, apt, a dpkg_selections loop to hold): every call costs one
remote Python start per task and per loop item, and 13 roles call it. This module reads dpkg's database
once; when every package is installed at its pin (and held) it returns at once, unchanged; otherwise it
releases the holds of the packages it must move, installs `name=version` in one apt-get run (services
kept from starting when asked: policy-rc.d exit 101, removed again whatever happens), checks the result
against the pins and holds the packages. Standard library only (runs on the node).
"""

# no `from __future__ import annotations`: the dataclasses must not need their module in sys.modules
# (Ansible runs a module from its payload); Python >= 3.10 on every node and the controller.
import os
import subprocess
import time
from dataclasses import dataclass, field

DOCUMENTATION = r"""
module: lcm_apt_pinned
short_description: Install Debian packages at exact versions and hold them (one module run)
description:
  - Reads the installed versions and selections of the named packages from dpkg's database.
  - Packages not installed, or installed at another version than their pin, are installed at the pinned
    version with apt-get (downgrades allowed, no recommends, conffiles kept); their holds are released first.
    The apt index is refreshed first when it is older than I(cache_valid_time), and once more when apt-get
    cannot find a pinned version.
  - After the install every package must be at its pin (otherwise the module fails naming the ones that
    are not); with I(hold) they are then marked hold in dpkg's selections.
  - With I(defer_start) a /usr/sbin/policy-rc.d that exits 101 keeps the packages' services from being
    started by their maintainer scripts for that one apt run; a policy-rc.d of the site's own is left alone.
  - Check mode reports what would change.
options:
  packages:
    description: Package name -> exact Debian version.
    type: dict
    required: true
  hold:
    description: Mark the packages hold after installing them.
    type: bool
    default: true
  defer_start:
    description: Keep apt from starting the packages' services during the install.
    type: bool
    default: false
  cache_valid_time:
    description: Refresh the apt index before installing when it is older than this (seconds).
    type: int
    default: 3600
author: lcm-infra
"""

EXAMPLES = r"""
- name: Install pinned packages
  lcm_apt_pinned:
    packages: {munge: "0.5.15-2", libmunge2: "0.5.15-2"}
    hold: true
"""

RETURN = r"""
installed:
  description: The packages (name=version) apt-get installed, upgraded or downgraded (would, in check mode).
  type: list
  returned: always
held:
  description: The packages newly marked hold (would be, in check mode).
  type: list
  returned: always
unheld:
  description: The held packages whose hold was released to move them to their pin.
  type: list
  returned: always
before:
  description: Name -> installed version before the run (null when not installed).
  type: dict
  returned: always
"""

POLICY_RC_D = "/usr/sbin/policy-rc.d"
POLICY_TEXT = "#!/bin/sh\n# lcm-infra lcm_apt_pinned: services start once configured\nexit 101\n"
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "APT_LISTCHANGES_FRONTEND": "none"}
APT_INSTALL = [
    "apt-get",
    "install",
    "--yes",
    "--no-install-recommends",
    "--allow-downgrades",
    "-o",
    "Dpkg::Options::=--force-confdef",
    "-o",
    "Dpkg::Options::=--force-confold",
]
# the stamps apt updates on a successful `apt-get update` (the first present one is read)
CACHE_STAMPS = ("/var/lib/apt/periodic/update-success-stamp", "/var/cache/apt/pkgcache.bin")


@dataclass(frozen=True)
class Installed:
    """One package in dpkg's database: its version (None when not installed) and selection."""

    version: str | None
    selection: str  # install, hold, deinstall, purge, unknown


@dataclass
class Plan:
    """What a run has to do, from the pins and dpkg's state."""

    install: list[str] = field(default_factory=list)  # names to install at their pin
    unhold: list[str] = field(default_factory=list)  # of those, the held ones
    hold: list[str] = field(default_factory=list)  # names not held yet (with hold=True)

    @property
    def changes(self) -> bool:
        return bool(self.install or self.hold)


def parse_dpkg_query(text: str) -> dict[str, Installed]:
    """Lines `name<TAB>version<TAB>status` of `dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n'`.

    Status is "<selection> <flag> <state>"; a package counts as installed only in state `installed`
    (config-files, half-installed, ... are not). A name listed twice (several architectures) keeps its
    installed line."""
    out: dict[str, Installed] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, version, status = parts
        words = status.split()
        selection = words[0] if words else "unknown"
        installed = len(words) == 3 and words[2] == "installed"
        entry = Installed(version if installed else None, selection)
        if name not in out or (entry.version is not None and out[name].version is None):
            out[name] = entry
    return out


def plan(pins: dict[str, str], state: dict[str, Installed], hold: bool) -> Plan:
    """The packages to install (absent, or at another version than the pin), the holds to release first,
    and the holds to set afterwards."""
    result = Plan()
    for name in sorted(pins):
        have = state.get(name, Installed(None, "unknown"))
        if have.version != pins[name]:
            result.install.append(name)
            if have.selection == "hold":
                result.unhold.append(name)
        if hold and (have.selection != "hold" or name in result.unhold):
            result.hold.append(name)
    return result


def query(names: list[str]) -> dict[str, Installed]:
    """dpkg's state of `names` (unknown names are simply missing: dpkg-query exits 1 for them)."""
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\\t${Version}\\t${Status}\\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    return parse_dpkg_query(proc.stdout)


def set_selections(names: list[str], selection: str) -> None:
    """`dpkg --set-selections` for `names` (hold / install)."""
    text = "".join(f"{n} {selection}\n" for n in names)
    subprocess.run(["dpkg", "--set-selections"], input=text, text=True, check=True, capture_output=True)


def cache_age() -> float:
    """Seconds since the apt index was last refreshed (infinite when it never was)."""
    for stamp in CACHE_STAMPS:
        try:
            return time.time() - os.stat(stamp).st_mtime
        except OSError:
            continue
    return float("inf")


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "dict", "required": True},
            "hold": {"type": "bool", "default": True},
            "defer_start": {"type": "bool", "default": False},
            "cache_valid_time": {"type": "int", "default": 3600},
        },
        supports_check_mode=True,
    )
    pins = {str(k): str(v) for k, v in module.params["packages"].items()}
    bad = sorted(n for n, v in pins.items() if not n or not v or any(c.isspace() for c in n + v))
    if bad:
        module.fail_json(msg=f"lcm_apt_pinned: empty names or versions, or ones with spaces: {bad}")
    names = sorted(pins)
    before = query(names)
    todo = plan(pins, before, module.params["hold"])
    result = {
        "changed": todo.changes,
        "installed": [f"{n}={pins[n]}" for n in todo.install],
        "held": todo.hold,
        "unheld": todo.unhold,
        "before": {n: before[n].version if n in before else None for n in names},
    }
    if module.check_mode or not todo.changes:
        module.exit_json(**result)

    env = {**os.environ, **APT_ENV}

    def apt(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)

    if todo.install:
        if todo.unhold:
            set_selections(todo.unhold, "install")
        policy = module.params["defer_start"] and not os.path.lexists(POLICY_RC_D)
        try:
            if policy:
                with open(POLICY_RC_D, "w") as f:
                    f.write(POLICY_TEXT)
                os.chmod(POLICY_RC_D, 0o755)
            if cache_age() > module.params["cache_valid_time"]:
                apt(["apt-get", "update"])
            argv = APT_INSTALL + result["installed"]
            proc = apt(argv)
            if proc.returncode != 0:
                # a stale index lacks a newly pinned version: refresh once and retry
                upd = apt(["apt-get", "update"])
                if upd.returncode == 0:
                    proc = apt(argv)
            if proc.returncode != 0:
                module.fail_json(
                    msg=f"apt-get install of {' '.join(result['installed'])} failed (exit {proc.returncode})",
                    stdout=proc.stdout[-4000:],
                    stderr=proc.stderr[-4000:],
                    **{k: v for k, v in result.items() if k != "changed"},
                )
        finally:
            if policy and os.path.lexists(POLICY_RC_D):
                os.unlink(POLICY_RC_D)
        after = query(names)
        now = {n: after[n].version if n in after else None for n in names}
        off = {n: v for n, v in now.items() if v != pins[n]}
        if off:
            module.fail_json(
                msg=f"after apt-get install these packages are not at their pinned version: {off} (pins: "
                f"{ {n: pins[n] for n in off} })",
                **{k: v for k, v in result.items() if k != "changed"},
            )
    if todo.hold:
        set_selections(todo.hold, "hold")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
