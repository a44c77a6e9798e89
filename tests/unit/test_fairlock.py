"""FairLock (workers/fairlock.py): arrival-order grants, threading.Lock's timeout semantics, mutual exclusion."""

from __future__ import annotations

import threading
import time

import pytest

from workers.fairlock import FairLock

JOIN_S = 30  # a deadlock fails the test instead of hanging it


def _wait_for_waiters(lock: FairLock, n: int) -> None:
    deadline = time.monotonic() + JOIN_S
    while lock.waiting < n:
        assert time.monotonic() < deadline, f"{lock.waiting} waiters, expected {n}"
        time.sleep(0.001)


def _start(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_release_hands_the_lock_to_the_waiter_before_the_releaser_can_take_it_back():
    # threading.Lock fails this: the releasing thread re-takes it before the woken waiter runs
    for _ in range(20):
        lock, order = FairLock(), []
        lock.acquire()

        def waiter():
            with lock:
                order.append("waiter")

        thread = _start(waiter)
        _wait_for_waiters(lock, 1)
        lock.release()
        with lock:
            order.append("releaser")
        thread.join(JOIN_S)
        assert order == ["waiter", "releaser"]


def test_waiters_are_granted_in_arrival_order():
    lock, order = FairLock(), []
    lock.acquire()
    threads = []
    for i in range(5):

        def waiter(i=i):
            with lock:
                order.append(i)

        threads.append(_start(waiter))
        _wait_for_waiters(lock, i + 1)
    lock.release()
    for thread in threads:
        thread.join(JOIN_S)
    assert order == [0, 1, 2, 3, 4]
    assert not lock.locked()


def test_non_blocking_and_timed_acquire_behave_as_threading_lock():
    lock = FairLock()
    assert lock.acquire(blocking=False) and lock.locked()
    assert not lock.acquire(blocking=False)
    t0 = time.monotonic()
    assert not lock.acquire(timeout=0.05)
    assert time.monotonic() - t0 >= 0.05
    assert not lock.acquire(timeout=0)
    assert lock.waiting == 0
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()


def test_a_timed_out_waiter_leaves_the_queue_and_never_owns_the_lock_later():
    lock, got = FairLock(), []
    lock.acquire()
    first = _start(lambda: got.append(("first", lock.acquire(timeout=0.05))))
    _wait_for_waiters(lock, 1)
    second = _start(lambda: got.append(("second", lock.acquire(timeout=JOIN_S))))
    _wait_for_waiters(lock, 2)
    first.join(JOIN_S)
    assert got == [("first", False)] and lock.waiting == 1
    lock.release()  # to the second waiter, not the one that gave up
    second.join(JOIN_S)
    assert got[1] == ("second", True) and lock.locked()
    lock.release()
    assert not lock.locked() and lock.acquire(blocking=False)  # not lost to the timed-out waiter


def test_a_waiter_handed_the_lock_as_it_times_out_keeps_it():
    lock = FairLock()
    lock.acquire()
    leave = lock._leave

    def release_first(gate):  # the holder's release lands between the waiter's timeout and its leaving
        lock.release()
        return leave(gate)

    lock._leave = release_first
    assert lock.acquire(timeout=0.01)
    assert lock.locked() and lock.waiting == 0
    lock.release()
    assert not lock.locked()


def test_many_threads_exclude_each_other_and_finish():
    lock, counter, rounds, workers = FairLock(), [0], 2000, 8

    def work():
        for _ in range(rounds):
            with lock:
                value = counter[0]
                time.sleep(0)  # invites a switch between the read and the write
                counter[0] = value + 1

    threads = [_start(work) for _ in range(workers)]
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(thread.is_alive() for thread in threads), "deadlock"
    assert counter[0] == rounds * workers
    assert not lock.locked() and lock.waiting == 0
