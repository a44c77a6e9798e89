"""The simulator's kept WAN connections (experiments/sim/wan.py), as the emulated KV sender's ConnectionPool
(workers/kvwire/sockets.py) and Linux's tcp_slow_start_after_idle: a transfer on its peer's kept connections
starts at the window the last one left, restarted only after an idle RTO (not under bbr)."""

import pytest

from experiments.sim import clock
from experiments.sim.wan import INITIAL_WINDOW_SEGMENTS, MSS_BYTES, Line, LineParams, restart_window

MB = 1_000_000
FAT = LineParams(rate_bps=1e9, rtt_s=0.1)  # 12.5 MB a round trip; RTO 0.3 s
IW = INITIAL_WINDOW_SEGMENTS * MSS_BYTES


def second_transfer_s(gap_s: float, congestion: str = "cubic", peer=("p0", "md0")) -> float:
    """Seconds the second of two transfers to one peer takes (100 MB, then 10 MB gap_s after the first's ACK)."""
    env = clock.Environment()
    line = Line(env, FAT, congestion=congestion)
    took = []

    def go():
        yield line.transfer(100 * MB, 2, peer)
        yield env.timeout(FAT.one_way_s + gap_s)  # the receiver's ACK, then the gap
        t = env.now
        yield line.transfer(10 * MB, 2, peer)
        took.append(env.now - t)

    env.process(go())
    env.run()
    return took[0]


def cold_s(nbytes: float) -> float:
    """A new connection alone on FAT: rounds of one RTT from the initial window, doubling, until the rest fits
    in a window (or the window carries the line's rate), then the rest at the line's rate."""
    window, sent, seconds = IW, 0, 0.0
    while window < FAT.rate_bps / 8 * FAT.rtt_s and nbytes - sent > window:
        window, sent, seconds = window * 2, sent + window, seconds + FAT.rtt_s
    return FAT.one_way_s + seconds + (nbytes - sent) * 8 / FAT.rate_bps


def test_a_kept_connection_within_an_rto_skips_slow_start():
    assert second_transfer_s(0.0) == pytest.approx(FAT.one_way_s + 10 * MB * 8 / FAT.rate_bps)
    assert second_transfer_s(0.0) < cold_s(10 * MB) - 0.5  # slow start from 10 MSS: 7 rounds of 0.1 s


def test_after_idle_rtos_the_window_restarts_and_without_a_peer_every_transfer_is_cold():
    assert second_transfer_s(10.0) == pytest.approx(cold_s(10 * MB))  # halved 33 times: back to the IW
    assert second_transfer_s(0.0, peer=None) == pytest.approx(cold_s(10 * MB))
    assert second_transfer_s(10.0, congestion="bbr") == pytest.approx(second_transfer_s(0.0))  # bbr keeps it


def test_restart_window_halves_per_rto_beyond_the_first_down_to_the_initial_window():
    w = 12.5 * MB
    assert restart_window(w, 0.29, 0.3, IW) == w  # within an RTO: untouched
    assert restart_window(w, 0.31, 0.3, IW) == w / 2
    assert restart_window(w, 0.61, 0.3, IW) == w / 4
    assert restart_window(w, 60.0, 0.3, IW) == IW
