"""The UDP probe's receiver on loopback (real sockets): a duplicated datagram is kept and does not end the probe
before every probe came (it did: a link that duplicates read as one that loses, by as many)."""

import socket
import threading
import time

from topology.udp_probe import HEADER, receive


def test_duplicates_are_kept_and_the_probe_waits_for_every_distinct_probe():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = threading.Event()
    got = {}
    t = threading.Thread(target=lambda: got.update(r=receive(port, 3, idle_timeout_s=2.0, ready=ready.set)))
    t.start()
    ready.wait(5)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for seq in (0, 0, 1, 2):  # probe 0 duplicated, as netem sends a copy
            s.sendto(HEADER.pack(seq, time.monotonic_ns()) + bytes(16), ("127.0.0.1", port))
    t.join(10)
    r = got["r"]
    assert r.seqs == [0, 0, 1, 2] and r.received == 3 and r.duplicates == 1
