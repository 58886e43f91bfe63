#!/usr/bin/python
"""Documentation stub: the work is done by plugins/action/lcm_validate_spec.py on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: lcm_validate_spec
short_description: Validate the lcm-infra cluster spec, inventory groups, lock file and mirror settings
description:
  - Runs on the controller (action plugin). Checks the C(cluster) mapping against lcm_runner/spec/schema.yml
    and the cross-field rules, the inventory groups (controller exactly 1, compute at least 1, exclusive
    groups, partitions' groups, topology nodes), the C(lcm_lock) structure, the lock entries every enabled
    layer installs and the version pairs that must agree (lcm_runner/spec/lock_rules.py), and the mirror
    variables.
  - On success returns C(cluster), the spec with the schema's defaults filled in (playbooks/validate.yml
    sets it as every host's C(cluster) fact).
  - Fails with one line per error naming the field, the value found and what is expected.
options:
  spec:
    description: The cluster mapping (C(cluster) variable).
    type: dict
    required: true
  groups:
    description: Inventory groups to check (default the play's C(groups)).
    type: dict
  lock:
    description: The C(lcm_lock) mapping from versions.lock.yml.
    type: dict
  settings:
    description:
      - Role settings the lock's needs depend on (e.g. C(nvidia_driver_source), C(rdma_stack),
        C(enroot_caps), C(nccl_install_method)); default the ones the play's variables define, the rest
        are the roles' defaults.
    type: dict
  mirror:
    description: C(lcm_mirror), null, a directory or an http(s) URL.
    type: str
  apt_mirror:
    description: C(lcm_apt_mirror).
    type: str
  apt_security_mirror:
    description: C(lcm_apt_security_mirror).
    type: str
  pip_index_url:
    description: C(lcm_pip_index_url).
    type: str
author: lcm-infra
"""

EXAMPLES = r"""
- name: Validate the cluster spec
  lcm_validate_spec:
    spec: "{{ cluster }}"
    lock: "{{ lcm_lock }}"
"""

RETURN = r"""
errors:
  description: One string per error.
  type: list
  returned: always
cluster:
  description: The validated spec with the schema's defaults filled in.
  type: dict
  returned: success
"""
