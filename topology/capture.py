"""Packet capture with tcpdump inside a topology host, written as pcap.

Responsible for: starting tcpdump on one interface (headers only by default),
knowing when it really listens, and stopping it so the pcap is complete.
Not responsible for: reading pcaps (analysis does that with tshark/dpkt-free
parsing in `experiments`).
"""

from __future__ import annotations

import logging
import selectors
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)


class CaptureError(RuntimeError):
    """tcpdump did not start listening."""


def tcpdump_cmd(dev: str, path: Path, snaplen_bytes: int) -> list[str]:
    """argv of a headers-only capture that stays root (to write anywhere).

    --immediate-mode: libpcap otherwise holds packets in a ring block for up to a
    second, and a capture stopped within that second loses them.
    """
    return [
        "tcpdump",
        "-i",
        dev,
        "-s",
        str(snaplen_bytes),
        "-U",
        "--immediate-mode",
        "-n",
        "-Z",
        "root",
        "-w",
        str(path),
    ]


class Capture:
    """One tcpdump process in a host's namespace.

    ns_prefix: argv prefix entering the host's namespaces
    dev: interface to capture on
    path: pcap file to write
    snaplen_bytes: bytes kept per frame
    """

    def __init__(self, ns_prefix: list[str], dev: str, path: Path, snaplen_bytes: int = 128):
        self.argv = ns_prefix + tcpdump_cmd(dev, path, snaplen_bytes)
        self.path = path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10) -> None:
        """Start tcpdump and return once it reports it is listening."""
        log.info("capture: %s", " ".join(self.argv))
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not self._wait_listening(timeout_s):
            self.stop()
            raise CaptureError(f"tcpdump did not start listening within {timeout_s}s: {' '.join(self.argv)}")

    def _wait_listening(self, timeout_s: float) -> bool:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        seen = b""
        while time.monotonic() < deadline and self.proc.poll() is None:
            if sel.select(timeout=0.1):
                chunk = self.proc.stderr.read1(4096)
                seen += chunk
                if b"listening on" in seen:
                    return True
        log.error("tcpdump said: %s", seen.decode(errors="replace").strip())
        return False

    def stop(self, timeout_s: float = 5) -> None:
        """SIGINT (tcpdump flushes and closes the pcap), then SIGKILL if it hangs; by our own PID."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
