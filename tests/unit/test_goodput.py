"""TCP goodput from iperf3's receiver intervals, not its sum_received (which divides the bytes that drain
from the link's queue after the sender stopped by the sender's duration). Pure logic on hand-made JSON."""

from experiments.calibration import receiver_goodput_mbit


def test_goodput_leaves_out_omitted_and_drain_intervals():
    def mbit(m, s=1.0):
        return {"bytes": int(m * 1e6 / 8 * s), "seconds": s, "omitted": False}

    end = {
        "sum_received": {"bits_per_second": 20.3e6},  # what iperf3 reports: queue drain included
        "receiver_intervals": [{**mbit(5), "omitted": True}, mbit(19.1), mbit(19.1), mbit(19.1), mbit(40, 0.1)],
    }  # the last 0.1 s: the queue draining
    assert abs(receiver_goodput_mbit(end) - 19.1) < 0.01
    assert receiver_goodput_mbit({"sum_received": {"bits_per_second": 7e6}}) == 7.0  # no server intervals
