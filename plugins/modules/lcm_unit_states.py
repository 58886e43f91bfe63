#!/usr/bin/python
"""The systemd state of a few named units, in one `systemctl show` (roles/slurm, roles/pyxis).

`ansible.builtin.service_facts` lists every unit and every unit file of the node (and the SysV scripts):
3 to 11 s per call on the lab's 2 cores, twice per converge, when a role wants to know about two or
three units. This module asks systemd about the named units only. Standard library only (runs on the node).
"""

import subprocess

DOCUMENTATION = r"""
module: lcm_unit_states
short_description: The load, active and enablement state of named systemd units (one systemctl call)
description:
  - Runs C(systemctl show) for the named units and returns, per unit name (as given, C(.service) added
    when the name has no unit suffix), its C(LoadState), C(ActiveState) and C(UnitFileState).
  - A unit systemd does not know is returned with C(load=not-found), C(exists=false).
  - Read only; runs in check mode.
options:
  names:
    description: Unit names (C(slurmd) or C(slurmd.service)).
    type: list
    elements: str
    required: true
author: lcm-infra
"""

EXAMPLES = r"""
- name: Read the Slurm daemons' states
  lcm_unit_states:
    names: [slurmd, slurmctld]
  register: _units
- name: Restart slurmd where it runs
  ansible.builtin.service: {name: slurmd, state: restarted}
  when: _units.units['slurmd.service'].active == 'active'
"""

RETURN = r"""
units:
  description: Unit name -> {exists, load, active, enabled}; C(enabled) is systemd's UnitFileState
    (C(enabled), C(disabled), C(masked), C(static), or empty for a unit without a unit file).
  type: dict
  returned: always
"""

_PROPS = ("Id", "LoadState", "ActiveState", "UnitFileState")


def unit_name(name: str) -> str:
    return name if "." in name.rsplit("/", 1)[-1] else f"{name}.service"


def parse_show(text: str, names: list[str]) -> dict:
    """`systemctl show -p ...` output (one block per unit, in the order asked, blank-line separated)."""
    blocks = [b for b in text.strip("\n").split("\n\n")] if text.strip() else []
    if len(blocks) != len(names):
        raise ValueError(f"systemctl show returned {len(blocks)} blocks for {len(names)} units")
    out = {}
    for name, block in zip(names, blocks, strict=True):
        kv = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        load = kv.get("LoadState", "")
        out[name] = {
            "exists": load not in ("not-found", ""),
            "load": load,
            "active": kv.get("ActiveState", ""),
            "enabled": kv.get("UnitFileState", ""),
        }
    return out


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={"names": {"type": "list", "elements": "str", "required": True}},
        supports_check_mode=True,
    )
    names = [unit_name(n) for n in module.params["names"]]
    if not names:
        module.exit_json(changed=False, units={})
    cmd = ["systemctl", "show", "--property=" + ",".join(_PROPS), "--", *names]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        module.fail_json(msg=f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    try:
        units = parse_show(p.stdout, names)
    except ValueError as e:
        module.fail_json(msg=str(e), stdout=p.stdout)
    module.exit_json(changed=False, units=units)


if __name__ == "__main__":
    main()
