"""Incremental reading of the ranks' telemetry files (`<run_dir>/telemetry/rank<R>.jsonl`).

Each file is append-only JSON Lines written by a running, sometimes SIGKILLed, process. Only complete
lines are consumed: the offset stays at the start of a last line without its newline, which is read
again next time (never parsed half-written). A line that does not parse is skipped and counted, except
the one case a restart produces: a killed writer's partial record followed, on the same line, by the
restarted writer's complete record. The trainer writes every record as one `json.dumps` object whose
first key is `ts`, so the last `{"ts":` of such a line starts that complete record; it is kept when it
parses as a whole record (a `start` lost there would hide a restart and the rank's new host).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lcm_runner.telemetry import Record, TelemetryError, parse_line

RECORD_START = b'{"ts":'


@dataclass
class TailState:
    """Where reading a file stopped: its identity and the offset of the first unconsumed byte."""

    path: Path
    inode: int = -1
    offset: int = 0
    lineno: int = 0
    skipped: int = 0  # malformed lines, never guessed at
    salvaged: int = 0  # spliced lines whose trailing complete record was kept
    ranks: set[int] = field(default_factory=set)  # ranks whose records came from this file


def parse_salvaging(raw: bytes, source: str) -> tuple[Record | None, bool]:
    """(record or None for a blank line, salvaged?); TelemetryError when nothing complete is in it."""
    text = raw.decode("utf-8", errors="replace")
    try:
        return parse_line(text, source), False
    except TelemetryError:
        at = raw.rfind(RECORD_START)
        if at <= 0:
            raise
        return parse_line(raw[at:].decode("utf-8", errors="replace"), source), True


class Tail:
    """The new complete records of one file at each `read_new`."""

    def __init__(self, path: Path, chunk_limit: int = 64 << 20) -> None:
        self.state = TailState(path)
        self.chunk_limit = chunk_limit  # at most this much per call: a huge backlog is read over polls

    def read_new(self) -> tuple[set[int], list[Record]]:
        """(ranks to forget, new records). A file replaced (another inode) or truncated is read again
        from its start; the ranks its earlier records came from are returned so that the caller drops
        what it derived from them before it applies the records read again."""
        st = self.state
        forget: set[int] = set()
        try:
            info = os.stat(st.path)
        except OSError:  # gone, or not readable: nothing new (monitoring never stops over it)
            return forget, []
        if info.st_ino != st.inode or info.st_size < st.offset:
            forget = set(st.ranks)
            self.state = st = TailState(st.path, inode=info.st_ino)
        if info.st_size == st.offset:
            return forget, []
        try:
            with open(st.path, "rb") as fh:
                fh.seek(st.offset)
                chunk = fh.read(min(info.st_size - st.offset, self.chunk_limit))
        except OSError:
            return forget, []
        end = chunk.rfind(b"\n")
        if end < 0:
            return forget, []  # no complete line yet: read again from the same offset next time
        complete = chunk[: end + 1]
        st.offset += len(complete)
        records: list[Record] = []
        for raw in complete.split(b"\n")[:-1]:
            st.lineno += 1
            try:
                rec, salvaged = parse_salvaging(raw, f"{st.path}:{st.lineno}")
            except TelemetryError:
                st.skipped += 1
                continue
            if rec is None:
                continue
            st.salvaged += int(salvaged)
            st.ranks.add(rec.rank)
            records.append(rec)
        return forget, records
