"""Loaded by every Python process started with this directory on PYTHONPATH (tests only).

Appends each network attempt (socket.connect, name lookups) to the file named by LCM_NET_AUDIT, so a test
can prove which addresses ansible-playbook, its workers and the modules it ran tried to reach.
"""

import json
import os
import sys

_LOG = os.environ.get("LCM_NET_AUDIT")
_EVENTS = {
    "socket.connect",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.sendto",
}


def _hook(event, args):
    if event not in _EVENTS:
        return
    try:
        target = args[1] if event in ("socket.connect", "socket.sendto") else args[0]
        if isinstance(target, bytes):
            target = target.decode(errors="replace")
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {
                        "event": event,
                        "target": target if isinstance(target, str) else list(target)[:2],
                        "pid": os.getpid(),
                    },
                    default=str,
                )
                + "\n"
            )
    except Exception:  # never break the audited process
        pass


if _LOG:
    sys.addaudithook(_hook)
