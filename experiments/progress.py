"""Progress of a long step: a tqdm bar on a terminal, plain log lines at intervals elsewhere (CI logs).

Responsible for: one counter per step (a variant's requests, a sweep's runs), shown as a bar where
stderr is a terminal and otherwise as an INFO line at most every `every_s` seconds (and at the end),
so a CI log shows the step moving without a line per item.
Not responsible for: what is counted (the callers).
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm


class Progress:
    """Progress(what, total, log).update(done, note) ... .close(); `stream` for tests (default stderr)."""

    def __init__(
        self, what: str, total: int, log: logging.Logger, unit: str = "it", every_s: float = 10.0, stream=None
    ):
        self.what, self.total, self.log, self.every_s = what, total, log, every_s
        stream = sys.stderr if stream is None else stream
        self.bar = tqdm(total=total, desc=what, unit=unit, file=stream, leave=True) if stream.isatty() else None
        self.done, self.note, self._shown_at, self._shown = 0, "", time.monotonic(), -1

    def update(self, done: int, note: str = "") -> None:
        """`done` of `total` so far (absolute), with a short note (e.g. failures)."""
        self.done, self.note = done, note
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if note:
                self.bar.set_postfix_str(note, refresh=False)
        elif time.monotonic() - self._shown_at >= self.every_s or done >= self.total:
            self._line()

    def _line(self) -> None:
        if self.done != self._shown:
            self.log.info("%s: %d/%d%s", self.what, self.done, self.total, f" ({self.note})" if self.note else "")
            self._shown, self._shown_at = self.done, time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            self._line()
