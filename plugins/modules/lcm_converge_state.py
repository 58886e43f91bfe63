#!/usr/bin/python
"""The node side of site.yml's unchanged check: mark a complete converge, or list why one is needed.

Logic: plugins/module_utils/lcm_converge_state.py. The fingerprint comes from the controller
(plugins/action/lcm_converge_fingerprint.py); docs/lock-mirror-generations.md, "Unchanged converges".
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.lcm_converge_state import check, mark
from ansible.module_utils.lcm_generation_store import GenerationError

DOCUMENTATION = r"""
module: lcm_converge_state
short_description: Record a node's complete converge, or list every reason it must be converged again
description:
  - C(mark) writes <generations_dir>/converged.json (the inputs fingerprint, the current generation and the
    managed units active now), only when its bytes differ.
  - C(check) returns C(unchanged) and C(reasons) - a different fingerprint, a different current generation,
    any drift of a managed file or package from the current generation, a unit active at the last converge
    that is not active now, or no record at all. Never changes anything.
options:
  state:
    description: What to do.
    type: str
    choices: [check, mark]
    required: true
  fingerprint:
    description: sha256 of the converge's inputs (lcm_converge_fingerprint).
    type: str
    required: true
  generations_dir:
    description: Where generations live.
    type: path
    default: /var/lib/lcm/generations
  managed_dir:
    description: Where roles write their manifests.
    type: path
    default: /var/lib/lcm/managed.d
author: lcm-infra
"""

RETURN = r"""
unchanged:
  description: Nothing changed since the last complete converge (state=check).
  type: bool
  returned: always
reasons:
  description: Why the node must be converged (state=check); empty when unchanged.
  type: list
  returned: always
"""


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["check", "mark"]},
            "fingerprint": {"type": "str", "required": True},
            "generations_dir": {"type": "path", "default": "/var/lib/lcm/generations"},
            "managed_dir": {"type": "path", "default": "/var/lib/lcm/managed.d"},
        },
        supports_check_mode=True,
    )
    p = module.params
    gen_dir, managed_dir = Path(p["generations_dir"]), Path(p["managed_dir"])
    if p["state"] == "check":
        reasons = check(gen_dir, managed_dir, p["fingerprint"])
        module.exit_json(changed=False, unchanged=not reasons, reasons=reasons)
    try:
        changed, rec = mark(gen_dir, managed_dir, p["fingerprint"], check=module.check_mode)
    except GenerationError as exc:
        module.fail_json(msg=str(exc), unchanged=False, reasons=[])
    module.exit_json(changed=changed, unchanged=True, reasons=[], record=rec)


if __name__ == "__main__":
    main()
