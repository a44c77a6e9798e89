"""Mooncake FAST'25 traces as a workload: hash ids become token blocks, so prefix sharing is the trace's.

Responsible for: reading a trace in the FAST'25 format (one JSON object per
line: `timestamp` (ms from the trace start), `input_length`, `output_length`,
`hash_ids`: one id per 512-token block, equal ids = the same prefix block),
choosing its window (`start_s`, `max_requests`), scaling it to the testbed's
model (`tokens_per_hash_block` tokens per hash id; the output scaled by the
same factor, capped by `max_output_tokens` and so that prompt + output fit the
context, the prompt cut to fit where it must), the tokens of each hash id
(drawn from the seed and the id alone: equal ids give equal tokens; only the
ids the cut prompt needs are expanded, however many the line lists), arrival
times (`time_scale`), and each request's expected DRC hit: the whole blocks of
its prompt that a request earlier in the window already carried to the MD.
Not responsible for: the workload's requests themselves (experiments.spec.workload
makes them from `Entry`s, and its TraceError from `MooncakeError`), reading a line
safely (experiments.spec.tracefile), replaying them (experiments.run.loadgen) or
the hit the MD really had (experiments.analysis.records).

The expectation assumes every earlier request of the window ended at the MD
before this one was sent, and that the MD evicted nothing: the measured hit
agrees with it where that holds, and is lower where a request overlapped the
one that brings its prefix or the MD's cache was full.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from experiments.spec import tracefile
from workers.roles.routing import DRCMirror

MOONCAKE_BLOCK = 512  # tokens per hash id in the trace
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


class MooncakeError(ValueError):
    """A trace line is unreadable, or the window is empty; the message names the file and line."""


@dataclass(frozen=True)
class Entry:
    """One request of the window, scaled: line (in the file), prompt tokens, output tokens, arrival (s from
    the window's start), expected DRC hit (tokens, whole blocks)."""

    line: int
    tokens: tuple[int, ...]
    max_tokens: int
    arrival_s: float
    cached_tokens: int


def _int(d: dict, key: str, lo: int, where: str) -> int:
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise MooncakeError(f"{where}: {key} must be an int >= {lo}, got {tracefile.shown(v)}")
    return v


def _keys(d, where: str) -> dict:
    if not isinstance(d, dict):
        raise MooncakeError(
            f"{where}: a Mooncake trace line is an object with the keys {list(KEYS)}; got {tracefile.shown(d)}"
        )
    missing, unknown = [k for k in KEYS if k not in d], sorted(set(d) - set(KEYS))
    if missing or unknown:
        raise MooncakeError(
            f"{where}: a Mooncake trace line has exactly the keys {list(KEYS)}; "
            + "; ".join(f"{name} {keys}" for name, keys in (("missing", missing), ("unknown", unknown)) if keys)
        )
    return d


def _hash_ids(d: dict, where: str) -> list[int]:
    ids = d["hash_ids"]
    if not isinstance(ids, list):
        raise MooncakeError(f"{where}: hash_ids must be a list of ints >= 0, got {tracefile.shown(ids)}")
    for i, h in enumerate(ids):
        if not isinstance(h, int) or isinstance(h, bool) or h < 0:
            raise MooncakeError(f"{where}: hash_ids[{i}] must be an int >= 0, got {tracefile.shown(h)}")
    return ids


def _line(raw: str, where: str) -> dict:
    d = _keys(tracefile.parse(raw, where, MooncakeError), where)
    t = d["timestamp"]
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        raise MooncakeError(f"{where}: timestamp must be a finite number >= 0 (ms), got {tracefile.shown(t)}")
    n_in = _int(d, "input_length", 1, where)
    _int(d, "output_length", 1, where)
    ids, needed = _hash_ids(d, where), -(-n_in // MOONCAKE_BLOCK)
    if len(ids) < needed:
        raise MooncakeError(
            f"{where}: {len(ids)} hash_ids cannot cover input_length={n_in} "
            f"(one per {MOONCAKE_BLOCK}-token block: {needed} needed)"
        )
    return d


def read(path: Path) -> list[tuple[int, dict]]:
    """(line number, entry) of every request in the file, in timestamp order; MooncakeError names the line."""
    parsed = [(no, _line(raw, f"{path}:{no}")) for no, raw in tracefile.lines(path, MooncakeError) if raw.strip()]
    if not parsed:
        raise MooncakeError(f"{path}: no requests in the trace")
    return sorted(parsed, key=lambda x: x[1]["timestamp"])


class Blocks:
    """The tokens of each hash id: tokens_per_hash_block ints from (seed, id) alone; len() = ids expanded."""

    def __init__(self, seed: int, vocab: int, size: int):
        self.seed, self.vocab, self.size = seed, vocab, size
        self._cache: dict[int, tuple[int, ...]] = {}

    def __getitem__(self, h: int) -> tuple[int, ...]:
        if h not in self._cache:
            rng = random.Random(f"mooncake:{self.seed}:{h}")
            self._cache[h] = tuple(rng.randrange(self.vocab) for _ in range(self.size))
        return self._cache[h]

    def __len__(self) -> int:
        return len(self._cache)

    def prompt(self, ids: list[int], n_in: int) -> tuple[int, ...]:
        """The first n_in tokens of ids' blocks: only the ids those tokens need are expanded (a trace line may
        list far more ids than the scaled prompt keeps)."""
        return tuple(t for h in ids[: -(-n_in // self.size)] for t in self[h])[:n_in]


def load(path: Path, opts, vocab: int, block: int, context: int, seed: int) -> list[Entry]:
    """The window of a Mooncake trace, scaled, in timestamp order.

    opts: spec.MooncakeOptions (tokens_per_hash_block, time_scale, start_s, max_requests, max_output_tokens)
    """
    entries = [(no, d) for no, d in read(path) if d["timestamp"] / 1000 >= opts.start_s]
    if opts.max_requests:
        entries = entries[: opts.max_requests]
    if not entries:
        raise MooncakeError(f"{path}: no request at or after start_s={opts.start_s} s")
    scale = opts.tokens_per_hash_block / MOONCAKE_BLOCK
    # what the MD would hold: the router's own model of its DRC (whole blocks, matched up to len - 1),
    # with room for everything (the expectation assumes no eviction)
    seen = DRCMirror(block, capacity_blocks=sum(len(d["hash_ids"]) for _, d in entries) * opts.tokens_per_hash_block)
    blocks, out = Blocks(seed, vocab, opts.tokens_per_hash_block), []
    for no, d in entries:
        max_out = min(opts.max_output_tokens or context - 1, context - 1)
        n_out = min(max(1, math.ceil(d["output_length"] * scale)), max_out)
        n_in = min(max(1, math.ceil(d["input_length"] * scale)), context - n_out)
        tokens = blocks.prompt(d["hash_ids"], n_in)
        cached = seen.match(list(tokens))
        seen.insert(list(tokens))
        arrival = round((d["timestamp"] / 1000 - opts.start_s) * opts.time_scale, 3)
        out.append(Entry(no, tokens, n_out, arrival, cached))
    return out
