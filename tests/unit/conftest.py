"""Shared setup for the unit tests.

Several tests render role templates with Ansible's own engine in this process, and ansible-core 2.19
replaces `sys.intern` with a callable class when it is imported. torch._dynamo, imported later by
megatron-core, registers a polyfill with `substitute_in_graph(sys.intern)` and refuses anything that is
not a function ("substitute_in_graph expects a function"). Import torch._dynamo first, so the suite's
outcome does not depend on which test module happens to run first.
"""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):
    import torch._dynamo  # noqa: F401
