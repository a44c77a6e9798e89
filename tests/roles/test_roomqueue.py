"""RoomQueue's logic (workers/roles/roomqueue.py) against a block counter standing in for a cache.

The roles' real use of it: tests/roles/test_prefill_room.py (P over gRPC).
"""

import threading
import time

import pytest

from workers.errors import CapacityExceeded
from workers.roles.roomqueue import RoomQueue, RoomRefused


class Blocks:
    """total blocks, some used; open(rid, n) takes n or raises CapacityExceeded as the engine does."""

    def __init__(self, total: int, used: int):
        self.total, self.used, self.opened = total, used, []
        self.lock = threading.Lock()

    def open(self, rid: str, n: int) -> str:
        with self.lock:
            if n > self.total - self.used:
                raise CapacityExceeded(rid, n, self.total - self.used, self.total, 16)
            self.used += n
            self.opened.append(rid)
            return rid

    def free(self, n: int, queue: RoomQueue) -> None:
        with self.lock:
            self.used -= n
        queue.freed()


def _admit_in_thread(queue: RoomQueue, blocks: Blocks, rid: str, n: int, out: dict) -> threading.Thread:
    def run():
        try:
            out[rid] = queue.admit(rid, lambda: blocks.open(rid, n))
        except Exception as err:  # noqa: BLE001 - the test reads it
            out[rid] = err

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_len(queue: RoomQueue, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(queue) != n:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_with_room_it_opens_at_once_without_waiting():
    queue, blocks = RoomQueue(4, 5.0, "prefill"), Blocks(10, 0)
    assert queue.admit("a", lambda: blocks.open("a", 3)) == ("a", 0)


def test_no_queue_and_never_fitting_raise_the_engines_error_at_once():
    blocks = Blocks(10, 9)
    with pytest.raises(CapacityExceeded, match="can be freed now"):
        RoomQueue(0, 5.0, "prefill").admit("a", lambda: blocks.open("a", 3))  # max_waiting 0: as without a queue
    queue = RoomQueue(4, 5.0, "prefill")
    with pytest.raises(CapacityExceeded, match="larger than the whole cache"):
        queue.admit("big", lambda: blocks.open("big", 11))
    assert len(queue) == 0


def test_first_come_first_served_a_small_later_request_does_not_overtake():
    queue, blocks, out = RoomQueue(4, 10.0, "prefill"), Blocks(10, 8), {}
    head = _admit_in_thread(queue, blocks, "big", 5, out)
    _wait_len(queue, 1)
    small = _admit_in_thread(queue, blocks, "small", 1, out)  # 2 blocks are free: it would fit, but waits
    _wait_len(queue, 2)
    time.sleep(0.15)  # a few polls
    assert blocks.opened == []
    blocks.free(8, queue)
    head.join(10)
    small.join(10)
    assert blocks.opened == ["big", "small"]
    assert out["big"][1] > 0.1e9 and out["small"][1] > 0.1e9


def test_full_queue_deadline_and_a_caller_that_left_are_refused():
    queue, blocks, out = RoomQueue(1, 0.3, "prefill"), Blocks(10, 10), {}
    waiting = _admit_in_thread(queue, blocks, "a", 1, out)
    _wait_len(queue, 1)
    with pytest.raises(RoomRefused, match=r"prefill.max_waiting"):
        queue.admit("b", lambda: blocks.open("b", 1))
    waiting.join(10)
    assert isinstance(out["a"], RoomRefused) and "prefill.room_wait_ms" in str(out["a"])
    assert len(queue) == 0
    with pytest.raises(RoomRefused, match="left while waiting"):
        RoomQueue(1, 10.0, "prefill").admit("c", lambda: blocks.open("c", 1), stop=lambda: True)
