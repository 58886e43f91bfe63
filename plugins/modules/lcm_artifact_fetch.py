#!/usr/bin/python
"""Documentation stub: the work is done by plugins/action/lcm_artifact_fetch.py on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: lcm_artifact_fetch
short_description: Fetch a locked artifact into the controller cache and verify its sha256
description:
  - Controller-side (action plugin). Reads the artifact from the lock's C(url), or in mirror mode only from
    C(mirror)/C(filename). Streams to a temporary file, hashes it, and moves it into C(cache_dir)/C(name)/
    only when the sha256 equals the lock's. A cached file is re-hashed on every run.
  - Fails when the lock's sha256 is null (not locked) or does not match, before anything is installed.
options:
  name:
    description: Artifact name (key of lcm_lock.artifacts).
    type: str
    required: true
  entry:
    description: The lock entry (version, url, sha256, filename).
    type: dict
    required: true
  cache_dir:
    description: Controller cache directory.
    type: path
    required: true
  mirror:
    description: Mirror directory or URL (C(lcm_mirror)); null to use the lock's URL.
    type: str
  timeout:
    description: Network timeout in seconds.
    type: float
    default: 60
author: lcm-infra
"""

EXAMPLES = r"""
- name: Fetch enroot
  lcm_artifact_fetch:
    name: enroot
    entry: "{{ lcm_lock.artifacts.enroot }}"
    cache_dir: ~/.cache/lcm/artifacts
"""

RETURN = r"""
path:
  description: Cached file on the controller.
  type: str
  returned: success
sha256:
  description: Verified sha256.
  type: str
  returned: success
downloaded:
  description: Whether it was fetched on this run.
  type: bool
  returned: success
"""
