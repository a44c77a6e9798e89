"""netem's packet slots and 4-state loss chain, as pure Python (sch_netem.c's get_slot_next() and loss_4state()).

Responsible for: when the next slot opens and what it may carry (SlotClock), and one step of the 4-state
Markov loss chain (FourStateChain), both with the kernel's u32 arithmetic and draw order.
Not responsible for: the queue that uses them (topology.netem_model), the options' validation
(topology.netem_options).
"""

from __future__ import annotations

import random
from typing import Callable

U32_MAX = 0xFFFFFFFF
INT_MAX = 2**31 - 1
NS_PER_MS = 1_000_000

# sch_netem.c's states: 1 good, 2 good inside a burst, 3 lost in a burst, 4 an isolated loss.
TX_IN_GAP, TX_IN_BURST, LOST_IN_BURST, LOST_IN_GAP = 1, 2, 3, 4


def _u32(pct: float) -> int:
    return int(round(pct / 100 * U32_MAX))


class FourStateChain:
    """loss_4state(): a1 = p13, a2 = p31, a3 = p32, a4 = p14, a5 = p23 as u32; starts in state 1."""

    def __init__(self, rng: random.Random, p13: float, p31: float, p32: float, p23: float, p14: float):
        """rng: the queue's 32-bit source; p13..p14: the transition probabilities (%)."""
        self._rng = rng
        self.a1, self.a2, self.a3, self.a4, self.a5 = map(_u32, (p13, p31, p32, p14, p23))
        self.state = TX_IN_GAP

    def lost(self) -> bool:
        """One packet: move the chain, True when it lands in a lossy state (the kernel's sums wrap as u32)."""
        rnd = self._rng.getrandbits(32)
        a1, a2, a3, a4, a5 = self.a1, self.a2, self.a3, self.a4, self.a5
        if self.state == TX_IN_GAP:
            if rnd < a4:
                self.state = LOST_IN_GAP
                return True
            if a4 < rnd < (a1 + a4) & U32_MAX:
                self.state = LOST_IN_BURST
                return True
            return False
        if self.state == TX_IN_BURST:
            if rnd < a5:
                self.state = LOST_IN_BURST
                return True
            return False
        if self.state == LOST_IN_BURST:
            if rnd < a3:
                self.state = TX_IN_BURST
            elif a3 < rnd < (a2 + a3) & U32_MAX:
                self.state = TX_IN_GAP
            elif (a2 + a3) & U32_MAX < rnd:
                return True
            return False
        self.state = TX_IN_GAP  # LOST_IN_GAP: back to good, this packet passes
        return False


class SlotClock:
    """netem's slot state: slot_next (ns) and the budget left in the open slot.

    next_delay_ns: draws the time from one slot to the next (ns), as get_slot_next() does.
    """

    def __init__(self, next_delay_ns: Callable[[], int], max_packets: int, max_bytes: int, now_ns: int):
        """max_packets/max_bytes: the budget per slot, 0 = unlimited (the kernel's INT_MAX)."""
        self._next_delay_ns = next_delay_ns
        self.max_packets = max_packets or INT_MAX
        self.max_bytes = max_bytes or INT_MAX
        # netem_change(): the first slot is open at once.
        self.slot_next_ns = now_ns
        self.packets_left, self.bytes_left = self.max_packets, self.max_bytes

    def next_slot(self, now_ns: int) -> None:
        """get_slot_next(): the next slot opens a drawn delay after now, with a full budget."""
        self.slot_next_ns = now_ns + self._next_delay_ns()
        self.packets_left, self.bytes_left = self.max_packets, self.max_bytes

    def peek(self, now_ns: int, head_tts_ns: int) -> None:
        """Dequeue's first look at the head frame: a slot that opened before the frame is due is skipped."""
        if self.slot_next_ns < head_tts_ns:
            self.next_slot(now_ns)

    def may_send(self, now_ns: int) -> bool:
        """The open slot lets a due frame go now."""
        return self.slot_next_ns <= now_ns

    def sent(self, now_ns: int, frame_len: int) -> None:
        """A frame left in this slot: spend its budget; the next slot when it is spent."""
        self.packets_left -= 1
        self.bytes_left -= frame_len
        if self.packets_left <= 0 or self.bytes_left <= 0:
            self.next_slot(now_ns)
