"""netem's per-packet decisions, as pure Python.

Responsible for: one direction of an emulated link with the semantics of
Linux `net/sched/sch_netem.c` (v6.1) as configured by iproute2's `tc netem`:
duplicate, loss (random with correlation, Gilbert-Elliott), corrupt, queue
limit, delay with jitter from a distribution table and correlation, rate
(serialization), reorder with gap, and the time-ordered queue (tfifo) that
releases each frame at its time to send. Random draws are made in the
kernel's order from a seeded 32-bit source, so a seed reproduces a run.
Not responsible for: sockets, clocks or processes (see `topology.userspace`),
nor validating profiles (see `topology.profiles`). Time is whatever the
caller passes in as `now_ns`; the model never reads a clock.

Also slotting (topology.netem_slots: dequeue holds due frames until a slot is
open; an enqueue looks at the head as the kernel's qdisc run does), the 4-state
loss chain, `rate`'s packet overhead and cells (packet_time_ns), user .dist
tables, and a Mahimahi trace in place of `rate` (topology.rate_trace, this
testbed's own: the kernel has none).
Deliberate differences from the kernel, all of them outside LinkParams:
no ECN marking, no GSO segmentation (the wire must carry MTU frames); a
negative packet overhead larger than a frame counts it as 0 bytes (the kernel's
u64 would wrap).
Faithful quirks worth knowing: the correlated draw mixes toward 2^31, so a
correlated loss fires less often than loss_pct; tabledist() reduces the
correlated draw modulo 2*jitter or the table size, so delay correlation has
no visible effect; the pareto tables have mean -0.03 and sd 0.82 (x jitter).
On `set_params` every correlation, the Gilbert-Elliott state and the 4-state chain restart,
like a `tc qdisc replace` that names every option; queued frames are kept.
"""

from __future__ import annotations

import heapq
import logging
import random
import subprocess
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from topology.netem_options import SHIPPED_TABLES, read_table
from topology.netem_slots import FourStateChain, SlotClock
from topology.profiles import LinkParams
from topology.rate_trace import Trace, TraceClock, TraceError, load_trace

log = logging.getLogger(__name__)

U32_MAX = 0xFFFFFFFF
# Table values are fixed point with this scale (include/uapi/linux/pkt_sched.h).
NETEM_DIST_SCALE = 8192
# Kernel clamps jitter to the s32 that tabledist() takes (ns).
JITTER_MAX_NS = 0x7FFFFFFF
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
# Where iproute2 installs its tables when dpkg cannot tell us.
DIST_DIRS = (Path("/usr/lib/x86_64-linux-gnu/tc"), Path("/usr/lib/tc"), Path("/usr/lib64/tc"), Path("/usr/share/tc"))


class NetemConfigError(ValueError):
    """LinkParams that tc-netem itself would refuse, or a missing distribution table."""


def pct_to_u32(pct: float) -> int:
    """A percentage as iproute2 sends it to the kernel: rint(pct/100 * UINT32_MAX)."""
    return int(round(pct / 100 * U32_MAX))


def ms_to_ns(value_ms: float) -> int:
    """Milliseconds to the kernel's nanoseconds."""
    return int(round(value_ms * NS_PER_MS))


def _dist_dirs() -> list[Path]:
    try:
        out = subprocess.run(["dpkg", "-L", "iproute2"], capture_output=True, text=True, check=True).stdout
        found = [Path(line).parent for line in out.splitlines() if line.endswith(".dist")]
    except (OSError, subprocess.CalledProcessError):
        found = []
    return list(dict.fromkeys(found + list(DIST_DIRS)))


def parse_dist_table(text: str) -> tuple[int, ...]:
    """Parse an iproute2 .dist file: whitespace-separated ints, '#' starts a comment line."""
    values: list[int] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        values.extend(int(word) for word in line.split())
    return tuple(values)


@lru_cache(maxsize=None)
def load_dist_table(name: str) -> tuple[int, ...]:
    """The iproute2 distribution table `name` (normal, pareto, paretonormal), or a user's .dist file by path."""
    if name not in SHIPPED_TABLES:
        try:
            return read_table(name)
        except (OSError, ValueError) as err:
            raise NetemConfigError(str(err)) from None
    for directory in _dist_dirs():
        path = directory / f"{name}.dist"
        if path.exists():
            table = parse_dist_table(path.read_text())
            if not table:
                raise NetemConfigError(f"{path}: empty distribution table")
            log.debug("loaded %s (%d entries)", path, len(table))
            return table
    raise NetemConfigError(
        f"distribution table {name}.dist not found in {[str(d) for d in _dist_dirs()]} (install iproute2)"
    )


class CorrelatedRandom:
    """netem's `crndstate`: a u32 source mixed with its last answer by rho."""

    def __init__(self, rng: random.Random, correlation_pct: float):
        """rng: the shared 32-bit source; correlation_pct: rho (%)."""
        self._rng = rng
        self.rho = pct_to_u32(correlation_pct)
        self.last = rng.getrandbits(32)  # init_crandom()

    def next(self) -> int:
        """get_crandom(): a u32, correlated with the previous one when rho > 0."""
        value = self._rng.getrandbits(32)
        if self.rho == 0:
            return value
        rho = self.rho + 1
        answer = (value * ((1 << 32) - rho) + self.last * rho) >> 32
        self.last = answer
        return answer


def tabledist(mu: int, sigma: int, state: CorrelatedRandom, table: tuple[int, ...] | None) -> int:
    """netem's tabledist(): a delay around mu (ns) with spread sigma (ns)."""
    if sigma == 0:
        return mu
    rnd = state.next()
    if table is None:  # uniform in [mu - sigma, mu + sigma)
        return (rnd % (2 * sigma)) + mu - sigma
    t = table[rnd % len(table)]
    x = (sigma % NETEM_DIST_SCALE) * t
    x += NETEM_DIST_SCALE // 2 if x >= 0 else -(NETEM_DIST_SCALE // 2)
    return _c_div(x, NETEM_DIST_SCALE) + (sigma // NETEM_DIST_SCALE) * t + mu


def _c_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as in C."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


class Lateness:
    """How late frames left against the departure time netem's algorithm gave them: a histogram of
    BUCKET_NS buckets up to BUCKETS x BUCKET_NS, one overflow bucket, and the maximum (ns). An emulator
    that falls behind (no CPU to spare) shows here, not in the link it claims to be."""

    BUCKET_NS = 10_000
    BUCKETS = 1000

    def __init__(self):
        self.counts = [0] * (self.BUCKETS + 1)
        self.max_ns = 0
        self.recent_max_ns = 0  # since the last to_dict(reset_recent=True): one window's maximum

    def add(self, late_ns: int) -> None:
        i = late_ns // self.BUCKET_NS
        self.counts[i if 0 <= i < self.BUCKETS else (0 if i < 0 else self.BUCKETS)] += 1
        if late_ns > self.recent_max_ns:
            self.recent_max_ns = late_ns
            if late_ns > self.max_ns:
                self.max_ns = late_ns

    def to_dict(self, reset_recent: bool = False) -> dict:
        """Sparse form: {"bucket_ns", "counts": {index: frames}, "max_ns", "recent_max_ns"}; reset_recent
        starts a new window's maximum (the snapshot still carries the one that ends)."""
        out = {
            "bucket_ns": self.BUCKET_NS,
            "counts": {str(i): c for i, c in enumerate(self.counts) if c},
            "max_ns": self.max_ns,
            "recent_max_ns": self.recent_max_ns,
        }
        if reset_recent:
            self.recent_max_ns = 0
        return out


def lateness_between(before: dict | None, after: dict) -> dict:
    """Lateness of the frames sent between two Lateness.to_dict() snapshots (pure): frames, p50/p99/max
    in us (a percentile is its bucket's upper edge; max: the highest bucket's upper edge, or the overall
    maximum when that bucket is the overflow)."""
    width, top = after["bucket_ns"], Lateness.BUCKETS
    old = (before or {}).get("counts", {})
    diff = {int(i): c - old.get(i, 0) for i, c in after["counts"].items() if c - old.get(i, 0) > 0}
    frames = sum(diff.values())
    if not frames:
        return {"frames": 0, "p50_us": None, "p99_us": None, "max_us": None}

    window_max_ns = after.get("recent_max_ns") if before is not None else None  # exact: reset at `before`

    def edge_us(i: int) -> float:
        return (window_max_ns or after["max_ns"]) / 1000 if i >= top else (i + 1) * width / 1000

    def pct(q: float) -> float:
        seen = 0
        for i in sorted(diff):
            seen += diff[i]
            if seen >= q * frames:
                return edge_us(i)
        return edge_us(max(diff))

    max_us = window_max_ns / 1000 if window_max_ns else edge_us(max(diff))
    return {"frames": frames, "p50_us": pct(0.5), "p99_us": pct(0.99), "max_us": max_us}


@dataclass
class NetemCounters:
    """What one direction did since it started (frames)."""

    received: int = 0  # frames offered to enqueue()
    sent: int = 0  # frames handed out by pop_due()
    dropped_loss: int = 0  # lost by the loss model
    dropped_limit: int = 0  # queue overflow (qlen >= limit)
    duplicated: int = 0  # extra copies made
    corrupted: int = 0  # frames with one flipped bit
    reordered: int = 0  # frames sent at once, ahead of the delayed ones


@dataclass(frozen=True)
class Decision:
    """What enqueue() decided for one copy of a frame.

    outcome: queued | dropped_loss | dropped_limit
    time_to_send_ns: when the copy leaves (ns, caller's clock); None if dropped
    duplicate: this is the extra copy made by `duplicate`
    reordered: put at the head of the queue, sent at once
    corrupt_at: (byte index, bit) flipped, or None
    """

    outcome: str
    time_to_send_ns: int | None = None
    duplicate: bool = False
    reordered: bool = False
    corrupt_at: tuple[int, int] | None = None


@dataclass(frozen=True)
class _Config:
    """LinkParams in the kernel's units (u32 probabilities, ns, bytes/s)."""

    latency_ns: int
    jitter_ns: int
    table: tuple[int, ...] | None
    rate_bytes_per_s: int
    packet_overhead: int
    cell_size: int
    cell_overhead: int
    trace: Trace | None
    limit_pkts: int
    loss: int
    duplicate: int
    corrupt: int
    reorder: int
    gap: int
    ge: tuple[int, int, int, int] | None  # a1=p, a2=r, a3=h, a4=1-k


def config_from_params(params: LinkParams) -> _Config:
    """Translate LinkParams as iproute2 + netem_change() would (the combinations tc refuses, LinkParams
    refuses when it is built)."""
    table = None
    if params.delay_distribution != "uniform":
        table = load_dist_table(params.delay_distribution)
    try:
        trace = load_trace(params.rate_trace) if params.rate_trace else None
    except TraceError as err:
        raise NetemConfigError(str(err)) from None
    ge = None
    if params.loss_ge is not None:
        g = params.loss_ge
        # iproute2 takes "1-h" and sends the kernel h = UINT32_MAX - (1-h).
        ge = (
            pct_to_u32(g.p_pct),
            pct_to_u32(g.r_pct),
            U32_MAX - pct_to_u32(g.bad_loss_pct),
            pct_to_u32(g.good_loss_pct),
        )
    return _Config(
        latency_ns=ms_to_ns(params.delay_ms),
        jitter_ns=min(abs(ms_to_ns(params.jitter_ms)), JITTER_MAX_NS),
        table=table,
        rate_bytes_per_s=int(round(params.rate_mbit * 1e6 / 8)),
        packet_overhead=params.rate_packet_overhead_bytes,
        cell_size=params.rate_cell_bytes,
        cell_overhead=params.rate_cell_overhead_bytes,
        trace=trace,
        limit_pkts=params.effective_limit_pkts,
        loss=pct_to_u32(params.loss_pct),
        duplicate=pct_to_u32(params.duplicate_pct),
        corrupt=pct_to_u32(params.corrupt_pct),
        reorder=pct_to_u32(params.reorder_pct),
        # iproute2: reorder without gap means gap 1 (every frame may be reordered).
        gap=params.reorder_gap or (1 if params.reorder_pct else 0),
        ge=ge,
    )


class NetemQueue:
    """One direction of a netem link: enqueue frames, pop them when due."""

    def __init__(self, params: LinkParams, seed: int):
        """params: this direction's impairments; seed: seeds the 32-bit random source."""
        self._rng = random.Random(seed)
        self.counters = NetemCounters()
        self._tfifo: list[tuple[int, int, bytes]] = []  # heap of (time_to_send_ns, seq, frame)
        self._tfifo_last_ns: int | None = None  # latest time_to_send in _tfifo
        self._head: deque[tuple[int, bytes]] = deque()  # reordered frames: (time_to_send_ns, frame)
        self._seq = 0
        self._last_now_ns = 0  # the latest now_ns a caller passed (set_params has none of its own)
        self.set_params(params)

    # -- configuration -------------------------------------------------------

    def set_params(self, params: LinkParams) -> None:
        """Change the impairments live; frames already queued keep their times."""
        cfg = config_from_params(params)
        self.params = params
        self._cfg = cfg
        self._delay_cor = CorrelatedRandom(self._rng, params.delay_correlation_pct)
        self._loss_cor = CorrelatedRandom(self._rng, params.loss_correlation_pct)
        self._dup_cor = CorrelatedRandom(self._rng, params.duplicate_correlation_pct)
        self._reorder_cor = CorrelatedRandom(self._rng, params.reorder_correlation_pct)
        self._corrupt_cor = CorrelatedRandom(self._rng, params.corrupt_correlation_pct)
        self._ge_bad = False
        self._counter = 0
        st = params.loss_state
        self._four_state = st and FourStateChain(self._rng, st.p13_pct, st.p31, st.p32_pct, st.p23_pct, st.p14_pct)
        self._slot = self._slot_clock(params, self._last_now_ns)
        old = getattr(self, "_trace", None)
        # A trace keeps its clock across other changes (a schedule step); a new trace starts at its time 0.
        if cfg.trace is None or old is None or old.trace != cfg.trace:
            self._trace = TraceClock(cfg.trace, self._last_now_ns) if cfg.trace else None

    def _slot_clock(self, params: LinkParams, now_ns: int) -> SlotClock | None:
        s = params.slot
        if s is None or not (s.delay_ms or s.max_ms or s.jitter_ms):  # netem_change(): all zero = no slots
            return None
        if s.distribution:
            table, mu, sigma = load_dist_table(s.distribution), ms_to_ns(s.delay_ms), ms_to_ns(s.jitter_ms)
            state = CorrelatedRandom(self._rng, 0.0)  # the kernel passes no state: uncorrelated draws
            draw = lambda: tabledist(mu, min(sigma, JITTER_MAX_NS), state, table)  # noqa: E731
        else:
            lo, hi = ms_to_ns(s.delay_ms), ms_to_ns(s.max_ms)
            draw = lambda: lo + ((self._rng.getrandbits(32) * (hi - lo)) >> 32)  # noqa: E731
        return SlotClock(draw, s.packets, s.bytes, now_ns)

    # -- enqueue -------------------------------------------------------------

    def enqueue(self, now_ns: int, frame: bytes) -> list[Decision]:
        """Offer one frame at now_ns; returns one Decision per copy (duplicate first)."""
        decisions: list[Decision] = []
        self.counters.received += 1
        self._enqueue(now_ns, frame, True, decisions)
        return decisions

    def offer(self, now_ns: int, frame: bytes) -> None:
        """enqueue() without building Decisions (the forwarder's hot path)."""
        self.counters.received += 1
        self._enqueue(now_ns, frame, True, None)

    def _enqueue(self, now_ns: int, frame: bytes, may_duplicate: bool, out: list | None) -> None:
        self._last_now_ns = now_ns
        cfg = self._cfg
        count = 1
        if may_duplicate and cfg.duplicate and cfg.duplicate >= self._dup_cor.next():
            count += 1
        if self._loss_event():
            count -= 1
        if count == 0:
            self.counters.dropped_loss += 1
            if out is not None:
                out.append(Decision("dropped_loss", duplicate=not may_duplicate))
            return
        if count > 1:
            # The copy re-enters the qdisc with duplication off, before the original.
            self.counters.duplicated += 1
            self._enqueue(now_ns, frame, False, out)
        corrupt_at = None
        if cfg.corrupt and cfg.corrupt >= self._corrupt_cor.next():
            frame, corrupt_at = self._corrupt(frame)
        self._queue(now_ns, frame, not may_duplicate, corrupt_at, out)
        if self._slot and self._tfifo:
            self._slot.peek(now_ns, self._tfifo[0][0])  # the qdisc run after an enqueue looks at the head

    def _queue(self, now_ns: int, frame: bytes, is_dup: bool, corrupt_at, out: list | None) -> None:
        cfg = self._cfg
        if len(self) >= cfg.limit_pkts:
            self.counters.dropped_limit += 1
            if out is not None:
                out.append(Decision("dropped_limit", duplicate=is_dup, corrupt_at=corrupt_at))
            return
        if cfg.gap == 0 or self._counter < cfg.gap - 1 or cfg.reorder < self._reorder_cor.next():
            tts = self._time_to_send(now_ns, len(frame))
            self._counter += 1
            self._tfifo_push(tts, frame)
            reordered = False
        else:
            tts = now_ns
            self._counter = 0
            self._head.appendleft((tts, frame))
            self.counters.reordered += 1
            reordered = True
        if out is not None:
            out.append(Decision("queued", tts, is_dup, reordered, corrupt_at))

    def _time_to_send(self, now_ns: int, frame_len: int) -> int:
        cfg = self._cfg
        delay = tabledist(cfg.latency_ns, cfg.jitter_ns, self._delay_cor, cfg.table)
        if self._trace is not None:
            return self._trace.depart_ns(now_ns + delay, frame_len)
        if cfg.rate_bytes_per_s:
            last = self._last_time_to_send()
            if last is not None:
                # The last queued frame is the reference: its remaining time is a bonus.
                delay = max(0, delay - (last - now_ns))
                now_ns = last
            delay += self.packet_time_ns(frame_len)
        return now_ns + delay

    def packet_time_ns(self, frame_len: int) -> int:
        """packet_time_ns(): a frame's time on the wire at `rate`, with its packet overhead and cells (ns)."""
        cfg = self._cfg
        length = max(0, frame_len + cfg.packet_overhead)
        if cfg.cell_size:
            cells = -(-length // cfg.cell_size)  # an extra cell for the remainder
            length = max(0, cells * (cfg.cell_size + cfg.cell_overhead))
        return length * NS_PER_S // cfg.rate_bytes_per_s

    def _last_time_to_send(self) -> int | None:
        last = self._tfifo_last_ns
        if self._head:
            head_tail = self._head[-1][0]
            last = head_tail if last is None or head_tail > last else last
        return last

    def _tfifo_push(self, tts: int, frame: bytes) -> None:
        self._seq += 1
        heapq.heappush(self._tfifo, (tts, self._seq, frame))
        if self._tfifo_last_ns is None or tts > self._tfifo_last_ns:
            self._tfifo_last_ns = tts

    def _loss_event(self) -> bool:
        cfg = self._cfg
        if cfg.ge is not None:
            return self._loss_gilbert_elliott(cfg.ge)
        if self._four_state:
            return self._four_state.lost()
        return bool(cfg.loss) and cfg.loss >= self._loss_cor.next()

    def _loss_gilbert_elliott(self, ge: tuple[int, int, int, int]) -> bool:
        p, r, h, k1 = ge
        u32 = self._rng.getrandbits
        if not self._ge_bad:
            if u32(32) < p:
                self._ge_bad = True
            return u32(32) < k1
        if u32(32) < r:
            self._ge_bad = False
        return u32(32) > h

    def _corrupt(self, frame: bytes) -> tuple[bytes, tuple[int, int]]:
        index = (self._rng.getrandbits(32) * len(frame)) >> 32  # prandom_u32_max(len)
        bit = (self._rng.getrandbits(32) * 8) >> 32
        data = bytearray(frame)
        data[index] ^= 1 << bit
        self.counters.corrupted += 1
        return bytes(data), (index, bit)

    # -- dequeue -------------------------------------------------------------

    def __len__(self) -> int:
        """Frames queued (netem's qlen)."""
        return len(self._tfifo) + len(self._head)

    def next_departure_ns(self) -> int | None:
        """When the next frame is due (ns), or None when the queue is empty."""
        if self._head:
            return self._head[0][0]
        if not self._tfifo:
            return None
        # qdisc_watchdog_schedule_ns(max(time_to_send, slot_next)).
        return max(self._tfifo[0][0], self._slot.slot_next_ns) if self._slot else self._tfifo[0][0]

    def pop_due(self, now_ns: int, lateness: Lateness | None = None) -> list[bytes]:
        """Every frame whose time to send is <= now_ns, in departure order; each one's lateness (now_ns
        against its time to send) is added to `lateness` when given."""
        out = [frame for _, frame in self._head]
        if lateness is not None:
            for tts, _ in self._head:
                lateness.add(now_ns - tts)
        self._head.clear()
        tfifo, slot = self._tfifo, self._slot
        while tfifo and tfifo[0][0] <= now_ns:
            if slot:
                slot.peek(now_ns, tfifo[0][0])
                if not slot.may_send(now_ns):
                    break
            tts, _, frame = heapq.heappop(tfifo)
            out.append(frame)
            if lateness is not None:  # a frame held for its slot left on time when the slot opened
                lateness.add(now_ns - (max(tts, slot.slot_next_ns) if slot else tts))
            if slot:
                slot.sent(now_ns, len(frame))
        if not tfifo:
            self._tfifo_last_ns = None
        self.counters.sent += len(out)
        return out


def periodic_delays_ns(params: LinkParams, count: int, interval_ns: int, frame_bytes: int, seed: int = 0) -> list[int]:
    """One-way delays (ns) netem gives `count` frames arriving every `interval_ns`.

    What a periodic probe should measure: with a rate and jitter, each frame
    waits for the one before it in netem's tfifo, so the mean exceeds
    delay_ms and the spread shrinks; a fidelity check compares against this.
    Lost frames are left out; the queue limit is lifted (the probe is light).
    """
    # Frames already due need not be popped: a `last` in the past gives the same time_to_send.
    queue = NetemQueue(params.replace(limit_pkts=10 * count + 1), seed)
    delays = []
    for i in range(count):
        now = i * interval_ns
        delays += [d.time_to_send_ns - now for d in queue.enqueue(now, bytes(frame_bytes)) if d.outcome == "queued"]
    return delays
