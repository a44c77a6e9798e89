"""A simulated worker's KV memory: the blocks its open requests hold, a queue of those waiting, an MD's LRU DRC,
a P's prefix cache.

Responsible for: `kv_capacity_tokens` (a worker's KV room: its accelerators' memory beside the model's weights,
the roofline's own `kv_capacity_tokens`, which the modelled engine and the deployment check size the cache by;
real compute: the spec's capacity_tokens, the emulated engine's own slots), and `KVRoom`: blocks reserved by open
requests, a first-come first-served queue of requests waiting for room (only the head is admitted, so a later,
smaller request never overtakes an earlier one: workers/roles/roomqueue.py), each bounded by a deadline, the
blocks an MD's finished sessions leave cached (its DRC), evicted least recently used when a request needs room,
and the refusal of a request that can never fit (workers.errors.CapacityExceeded's message, as the engine's);
`PrefixCache`: the prompts' block prefixes a P's radix tree keeps, named by `prompt_chain` / `extend_chain`.
Not responsible for: when a request asks for room or leaves, or what a refusal does (experiments.sim.pipeline).

Blocks: a request reserves blocks_for(prompt + max_tokens), as the engine's open does (P: prompt + 1), less its
session's shared head (the system prompt: every worker holds it once, from the warm-up, for every session); a
session's cached blocks on an MD are its private part (what it holds beyond that head), and a turn that opens
on them pins them: they become part of its reservation.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable

from experiments.sim import clock
from experiments.sim.config import WorkerModel
from experiments.sim.realcompute import MeasuredRoofline
from workers.errors import CapacityExceeded


def kv_capacity_tokens(model: WorkerModel) -> int:
    """A worker's KV slots (tokens): its devices' memory beside the weights (modelled compute), or the spec's
    capacity_tokens (real compute: the small model's engine is sized by them, not by a device's memory)."""
    if isinstance(model.roofline, MeasuredRoofline):
        return model.capacity_tokens
    return model.roofline.kv_capacity_tokens()


class _Waiter:
    __slots__ = ("blocks", "session", "event")

    def __init__(self, blocks: int, session: str | None, event: clock.Event):
        self.blocks, self.session, self.event = blocks, session, event


class KVRoom:
    """One worker's KV blocks. env: the simulation; capacity_tokens: its KV slots; block_size: tokens a block."""

    def __init__(self, env: clock.Environment, capacity_tokens: int, block_size: int):
        self.env, self.block = env, block_size
        self.capacity = capacity_tokens // block_size  # blocks
        self.reserved = 0  # blocks held by open requests
        self.cached: OrderedDict[str, tuple[int, int]] = OrderedDict()  # session -> (tokens, blocks), LRU first
        self.cached_blocks = 0
        self.waiting: deque[_Waiter] = deque()
        self.evictions = 0  # cached sessions dropped to make room

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def refusal(self, request_id: str, tokens: int) -> str | None:
        """The engine's CapacityExceeded message when `tokens` can never fit here (more than the whole cache);
        None when they can."""
        need = self.blocks_for(tokens)
        if need <= self.capacity:
            return None
        return str(CapacityExceeded(request_id, need, self.capacity - self.reserved, self.capacity, self.block))

    def held(self, session: str) -> int | None:
        """Tokens of session this worker's DRC holds (None: none beyond the shared head)."""
        entry = self.cached.get(session)
        return entry[0] if entry else None

    def open(self, blocks: int, session: str | None = None) -> bool:
        """Reserve blocks now if nobody waits and they fit beside the open requests (cached sessions are evicted,
        least recently used first); session's own cached blocks are part of them. False: no room now."""
        if self.waiting or self.reserved + blocks > self.capacity:
            return False
        self._take(blocks, session)
        return True

    def wait(self, blocks: int, deadline_s: float, session: str | None = None) -> clock.Event:
        """An event whose value is True once blocks are reserved (in turn, first come first served), or False at
        deadline_s (the request gave up; it leaves the queue)."""
        w = _Waiter(blocks, session, self.env.event())
        self.waiting.append(w)
        self._serve()
        if not w.event.triggered:
            self.env.call_in(max(0.0, deadline_s - self.env.now), self._expire, w)
        return w.event

    def release(self, blocks: int, keep: tuple[str, int, int] | None = None) -> None:
        """An open request's blocks come back; keep: (session, tokens, blocks) of them left cached (an MD's DRC,
        most recently used)."""
        self.reserved -= blocks
        if keep is not None:
            session, tokens, kept = keep
            old = self.cached.pop(session, None)
            if old is not None:
                self.cached_blocks -= old[1]
            self.cached[session] = (tokens, kept)
            self.cached_blocks += kept
            self._evict()
        self._serve()

    def _take(self, blocks: int, session: str | None) -> None:
        own = self.cached.pop(session, None) if session is not None else None
        if own is not None:
            self.cached_blocks -= own[1]
        self.reserved += blocks
        self._evict()

    def _evict(self) -> None:
        while self.cached and self.reserved + self.cached_blocks > self.capacity:
            _, (_, blocks) = self.cached.popitem(last=False)
            self.cached_blocks -= blocks
            self.evictions += 1

    def _serve(self) -> None:
        while self.waiting and self.reserved + self.waiting[0].blocks <= self.capacity:
            w = self.waiting.popleft()
            self._take(w.blocks, w.session)
            w.event.succeed(True)

    def _expire(self, w: _Waiter) -> None:
        if w.event.triggered:
            return
        self.waiting.remove(w)
        w.event.succeed(False)
        self._serve()  # the head may have changed


def prompt_chain(tokens: list[int] | tuple[int, ...], block: int) -> list[int]:
    """The names of a prompt's whole blocks, from its tokens: each names its content and every block before it
    (equal names, equal prefixes: as routing.DRCMirror chains them)."""
    chain, h = [], 0
    for i in range(0, len(tokens) - len(tokens) % block, block):
        h = hash((h, tuple(tokens[i : i + block])))
        chain.append(h)
    return chain


def extend_chain(chain: list[int], prompt_len: int, block: int, salt: int) -> list[int]:
    """chain (a previous turn's prompt's, extended in place) made the names of a later turn's prompt of
    prompt_len tokens: the previous prompt, its reply and the new text. The previous prompt's whole blocks keep
    their names; the blocks from there on get names no other prompt has (salt: unique to the prompt), since
    the reply's tokens are the reference run's, which the simulator does not have."""
    h = chain[-1] if chain else 0
    for i in range(len(chain), prompt_len // block):
        h = hash((h, salt, i))
        chain.append(h)
    return chain


class PrefixCache:
    """One P worker's prefix cache as its engine's radix tree keeps it (workers/engine.py, workers/radix.py): after
    each prefill, the prompt's whole blocks (the engine's finish inserts the KV it computed: the prompt, never the
    output, which P does not decode); a prompt matches its longest cached prefix, whole blocks, at most len - 1
    tokens, and the prefix it matched is pinned until its prefill ends; least recently used blocks are evicted
    past the room given. Blocks are named by prompt_chain.

    Recency is a stamp per block (an int: a dict store per block at each insert, not an OrderedDict move per block
    at each match and insert: those were ~20% of a published-scale run): an insert stamps a prompt's blocks with
    fresh numbers, its first block the highest, so a block is never older than one after it in any prompt
    (within a prompt the tail goes before the head, and the system prompt, in every prompt, stays: the radix tree
    evicts leaves). The blocks held are therefore always whole prefixes of the prompts (pins too: each is a
    prefix), and a match finds its length by bisection. An insert writes the names it adds at once and defers the
    new stamps of those it already holds (the prompt's held prefix, found by the same bisection) until an
    eviction reads them: the stamps are then the ones the insert would have written, in the same order (writing
    every stamp at each insert was ~6% of a published-scale run under cProfile, ~3% by the clock, where P's room is
    rarely short). block_size: tokens a block."""

    def __init__(self, block_size: int):
        self.block = block_size
        self.stamps: dict[int, int] = {}  # block name -> its last insert (higher: more recent)
        self.pins: dict[str, tuple[list[int], int]] = {}  # request -> (its chain, blocks matched) while it prefills
        self._clock = 0
        self._restamp: list[tuple[list[int], int, int]] = []  # (chain, blocks held, its insert's clock), in order
        self.hit_tokens = self.prompt_tokens = self.lookups = self.evictions = 0

    def match(self, chain: list[int], prompt_len: int, pin: str = "") -> int:
        """Tokens of the prompt (of prompt_len tokens, whole blocks named chain) this cache holds; pin: the
        request that keeps them from eviction until its unpin."""
        lo = self.held(chain, prompt_len) // self.block
        if pin and lo:
            self.pins[pin] = (chain, lo)
        self.lookups += 1
        self.hit_tokens += lo * self.block
        self.prompt_tokens += prompt_len
        return lo * self.block

    def held(self, chain: list[int], prompt_len: int) -> int:
        """Tokens of the prompt this cache holds, as match finds them, without counting a lookup or pinning
        (policy.pick_p cache_aware's look, as the router's mirror of what each P prefilled)."""
        return self._prefix_held(chain, min(len(chain), (prompt_len - 1) // self.block)) * self.block

    def _prefix_held(self, chain: list[int], hi: int) -> int:
        """How many of chain's first hi blocks this cache holds: they are a prefix of it, so bisect it."""
        stamps, lo = self.stamps, 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in stamps:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def unpin(self, pin: str) -> None:
        self.pins.pop(pin, None)

    def insert(self, chain: list[int], room_blocks: int) -> None:
        """The prompt's whole blocks are cached (the most recent), then the cache is trimmed to room_blocks."""
        n, stamps = len(chain), self.stamps
        clock = self._clock + n
        lo = self._prefix_held(chain, n)  # the blocks it holds already
        if lo:  # their stamps, when an eviction reads them (a chain only grows at its end: chain[:lo] stays)
            self._restamp.append((chain, lo, clock))
            if len(self._restamp) > RESTAMP_AT_MOST:
                self._write_stamps()
        if lo < n:
            stamps.update(zip(chain[lo:], range(clock - lo, clock - n, -1)))
        self._clock = clock
        self.trim(room_blocks)

    def _write_stamps(self) -> None:
        """The deferred stamps, in their inserts' order (a later insert's stamp wins, as written at once)."""
        stamps = self.stamps
        for chain, held, top in self._restamp:
            stamps.update(zip(chain[:held], range(top, top - held, -1)))
        self._restamp = []

    def trim(self, room_blocks: int) -> None:
        """Evict least recently used blocks no prefill pins until at most room_blocks are cached (or only pinned
        ones are left)."""
        over = len(self.stamps) - max(0, room_blocks)
        if over <= 0:
            return
        if self._restamp:
            self._write_stamps()
        pinned = {h for chain, n in self.pins.values() for h in chain[:n]}
        free = [item for item in self.stamps.items() if item[0] not in pinned]
        for name, _ in heapq.nsmallest(over, free, key=_stamp_of):
            del self.stamps[name]
            self.evictions += 1


RESTAMP_AT_MOST = 4096  # deferred inserts written at the latest past this many (a long run's memory stays bounded)


def _stamp_of(item: tuple[int, int]) -> int:
    return item[1]


DROP_AT_ONCE = 32  # entries found done in a row at a deadline past which the rest done are dropped in one pass


class Deadlines:
    """Things that must happen by a deadline (a request's answer by timeouts.request_s, the prompt's KV at an MD by
    kv_wait_ms); one that has not is told so at its deadline. One timer for all, armed at the earliest deadline
    pending: one that ends in time costs no event (the timer drops every entry done before it). The entries wait
    in (deadline, order watched) order: those watched in deadline order (a request's, now + request_s) in a FIFO,
    the others in a heap; the timer takes the earlier head of the two. Once every entry due is told, a long run of
    entries found done drops every one done in one pass."""

    def __init__(self, env: clock.Environment):
        self.env, self.heap, self.fifo, self.armed_at, self._seq = env, [], deque(), math.inf, 0

    def watch(self, deadline_s: float, done: Callable[[], bool], late: Callable[[], None]) -> None:
        """Call late() at deadline_s unless done() says it happened by then."""
        self._push(deadline_s, done, late)

    def interrupt_unless(self, event: clock.Event, deadline_s: float) -> None:
        """Interrupt the active process (clock.Interrupt), which waits for event, at deadline_s unless it fired."""
        self._push(deadline_s, event, self.env.active_process)

    def _push(self, deadline_s: float, done, late) -> None:
        """done: a callable, or an event (done once processed); late: a callable, or the process to interrupt."""
        self._seq += 1
        entry = (deadline_s, self._seq, done, late)
        if not self.fifo or self.fifo[-1][0] <= deadline_s:
            self.fifo.append(entry)
        else:
            heapq.heappush(self.heap, entry)
        if deadline_s < self.armed_at:
            self._arm(deadline_s)

    def _drop_done(self) -> tuple[list, deque]:
        """Every entry done, dropped in one pass (its turn would drop it: done stays done), not one by one as
        it comes to the head (the run's first deadline finds nearly all of its ~20,000 done: ~4% of a run)."""
        self.fifo = deque(e for e in self.fifo if not _done(e[2]))
        self.heap = [e for e in self.heap if not _done(e[2])]
        heapq.heapify(self.heap)
        return self.heap, self.fifo

    def _arm(self, at_s: float) -> None:
        self.armed_at = at_s
        self.env.call_in(max(0.0, at_s - self.env.now), self._fire)

    def _fire(self, _arg) -> None:
        heap, fifo, now = self.heap, self.fifo, self.env.now
        self.armed_at = math.inf
        dropped = 0
        while fifo or heap:
            from_fifo = bool(fifo) and not (heap and heap[0] < fifo[0])  # (deadline, order): never equal
            deadline, _, done, late = fifo[0] if from_fifo else heap[0]
            finished = _done(done)
            if deadline > now and not finished:
                break
            if from_fifo:
                fifo.popleft()
            else:
                heapq.heappop(heap)
            if finished:
                dropped += 1
                if dropped >= DROP_AT_ONCE and deadline > now:  # every one due is told: drop the rest done at once
                    heap, fifo = self._drop_done()
                continue
            if isinstance(late, clock.Process):
                if late.is_alive:
                    late.interrupt("deadline")
            else:
                late()
        if fifo or heap:
            self._arm(min(fifo[0][0] if fifo else math.inf, heap[0][0] if heap else math.inf))


def _done(done) -> bool:
    return done.callbacks is None if isinstance(done, clock.Event) else done()
