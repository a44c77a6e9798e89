"""Progress of a long step: a tqdm bar on a terminal, plain log lines at intervals elsewhere (CI logs).

Responsible for: one counter per step (a variant's requests, a sweep's points, an image build's steps,
a pcap's bytes), shown as a bar where stderr is a terminal and otherwise as an INFO line at most every
`every_s` seconds (and at the end), so a CI log shows the step moving without a line per item.
Nothing is shown for a step that never moves (an image already built).
Not responsible for: what is counted (the callers).
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm


class Progress:
    """Progress(what, total, log).update(done, note) ... .close(); `stream` for tests (default stderr).

    total may come later, with an update (a build learns its step count from its first step); as_bytes=True
    counts bytes (the bar scales them, the lines say MB)."""

    def __init__(
        self,
        what: str,
        total: int | None,
        log: logging.Logger,
        unit: str = "it",
        every_s: float = 10.0,
        stream=None,
        as_bytes: bool = False,
    ):
        self.what, self.total, self.log, self.every_s = what, total, log, every_s
        self.unit, self.as_bytes = unit, as_bytes
        self.stream = sys.stderr if stream is None else stream
        self.bar: tqdm | None = None
        self.done, self.note, self._shown_at, self._shown, self._moved = 0, "", time.monotonic(), -1, False

    def update(self, done: int, note: str = "", total: int | None = None) -> None:
        """`done` of `total` so far (absolute), with a short note (e.g. failures, the step running)."""
        if total is not None:
            self.total = total
        self.done, self.note, self._moved = done, note, True
        if self.stream.isatty():
            self._bar_update()
        elif time.monotonic() - self._shown_at >= self.every_s or (self.total and done >= self.total):
            self._line()

    def _bar_update(self) -> None:
        if self.bar is None:
            self.bar = tqdm(
                total=self.total, desc=self.what, unit="B" if self.as_bytes else self.unit, unit_scale=self.as_bytes,
                file=self.stream, leave=True,
            )  # fmt: skip
        if self.bar.total != self.total:
            self.bar.total = self.total
        self.bar.update(self.done - self.bar.n)
        if self.note:
            self.bar.set_postfix_str(self.note, refresh=False)

    def _line(self) -> None:
        if self.done == self._shown:
            return
        if self.as_bytes:
            count = f"{self.done / 1e6:.0f}/{(self.total or 0) / 1e6:.0f} MB"
        else:
            count = f"{self.done}/{self.total if self.total is not None else '?'}"
        self.log.info("%s: %s%s", self.what, count, f" ({self.note})" if self.note else "")
        self._shown, self._shown_at = self.done, time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self._moved:
            self._line()
