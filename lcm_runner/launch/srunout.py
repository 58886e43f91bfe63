"""The JSON answers of a multi-task `srun --label` step, one stream per task.

slurmstepd forwards a task's stdout in messages of at most 1024 bytes and srun writes the messages of
all tasks as they arrive: a JSON line longer than that from one node is cut and interleaved with the
other nodes' pieces (measured on the lab: a 6 KB line per node from 2 nodes came out unparseable 3 times
in 5 runs without `--label`). With `--label` every piece carries its task id (`0: ...`, padded when
there are 10 tasks or more) and ends with a newline srun adds, so the pieces of each task are joined
again in order and the task's stream is read as a sequence of JSON values (the answers contain no raw
newline: json.dumps escapes them).
"""

from __future__ import annotations

import json
import re
from typing import Any

_LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")


def task_streams(out: str) -> dict[int, str]:
    """Task id -> its output, the labelled pieces joined in order (unlabelled lines are dropped:
    srun's own messages on a merged stream)."""
    streams: dict[int, list[str]] = {}
    for line in out.splitlines():
        m = _LABELLED.match(line)
        if m:
            streams.setdefault(int(m.group(1)), []).append(m.group(2))
    return {t: "".join(pieces) for t, pieces in sorted(streams.items())}


def json_values(stream: str) -> list[Any]:
    """Every JSON object in a task's joined stream (text between them, e.g. a warning, is skipped)."""
    dec = json.JSONDecoder()
    values: list[Any] = []
    i = stream.find("{")
    while i != -1:
        try:
            value, end = dec.raw_decode(stream, i)
        except json.JSONDecodeError:
            i = stream.find("{", i + 1)
            continue
        values.append(value)
        i = stream.find("{", end)
    return values


def answers(out: str) -> list[dict[str, Any]]:
    """The last JSON object each task printed, in task order."""
    found = []
    for stream in task_streams(out).values():
        objs = [v for v in json_values(stream) if isinstance(v, dict)]
        if objs:
            found.append(objs[-1])
    return found
