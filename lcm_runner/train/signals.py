"""SIGUSR1/SIGTERM -> finish the current step, checkpoint, exit ExitCode.REQUEUE.

The handler only records the signal; the training loop polls `pending()` after each step and all
ranks agree (a MAX all-reduce) so that a signal delivered to one rank stops every rank at the same step.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from types import FrameType

EXIT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)


@dataclass
class ExitSignalHandler:
    received: list[str] = field(default_factory=list)
    _previous: dict[int, object] = field(default_factory=dict)

    def install(self) -> None:
        for sig in EXIT_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)

    def pending(self) -> bool:
        return bool(self.received)

    def restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)  # type: ignore[arg-type]
        self._previous.clear()
