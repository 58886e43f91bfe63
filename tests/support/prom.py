"""The lab's Prometheus, queried from the host (tests/lab): one instant query -> the result vector."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from typing import Any

PROM = os.environ.get("LCM_LAB_PROMETHEUS", "http://10.89.42.10:9090")


def query(expr: str, timeout: float = 10) -> list[dict[str, Any]]:
    url = f"{PROM}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = json.loads(r.read().decode())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus query {expr!r}: {body}")
    return body["data"]["result"]
