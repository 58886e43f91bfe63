"""What `srun --label` prints for several tasks: each task's output cut into pieces (slurmstepd forwards
at most 1024 bytes per message), every piece labelled `<task>: ` and ended by a newline, the tasks'
pieces interleaved as they arrive (here: round robin)."""

from __future__ import annotations


def labelled(outputs: list[str], piece: int = 1024) -> str:
    width = len(str(len(outputs) - 1))
    queues = [[o[i : i + piece] for i in range(0, len(o), piece)] for o in outputs]
    lines: list[str] = []
    while any(queues):
        for t, q in enumerate(queues):
            if q:  # srun labels every line of a piece, and ends a piece cut mid-line with a newline
                lines += [f"{t:>{width}}: {ln}\n" for ln in q.pop(0).splitlines()]
    return "".join(lines)
