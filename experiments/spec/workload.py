"""Workloads: synthetic multi-turn agent traffic with a skewed prefix-hit distribution, or a replayed trace.

Responsible for: turning a spec's `workload` section into a fixed list of
`WorkloadRequest`s (pure, seeded: the same list for every variant), reading a
JSON-lines trace (bad lines rejected with their line and field), and the
*expected* decode-side hit of each request — what an unbounded DRC that has
seen every earlier turn would hold — which buckets requests identically in
every variant.
Not responsible for: sending requests (experiments.run.loadgen) or measuring the
real DRC hit (experiments.analysis.records, from the roles' events).

Shape of the synthetic traffic (PDD.md, "observation that makes it feasible"):

- every request begins with one shared system prompt (an agent's tools and
  rules), cached everywhere after a warm-up request;
- a session's first turn adds a task text: hit ~ system / (system + task);
- each later turn is the previous prompt + the model's actual reply + a short
  user or tool message: only that message and the partial last block are
  uncached, so most turns hit > 95%; a share of turns carries a large tool
  result (the low-hit tail);
- fresh one-turn requests add a new document after the system prompt;
- singular requests (long new input, short output; ~3-4%) are what PDD's
  filter keeps off the WAN.

Session starts, fresh and singular requests arrive as one Poisson process
(`session_rate_per_s`); a later turn is sent an exponential think time after
the previous turn's reply (closed loop, as an agent does).

Prompts of later turns are built by the load generator (they contain the
previous reply); `head_tokens` is what is appended after it.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from experiments.spec import mooncake, tracefile

KINDS = ("warmup", "turn", "fresh", "singular", "trace")
WARMUP_OUTPUT_TOKENS = 16  # above any singular output cap, so the warm-up reaches the MD in pdd
HIT_BUCKETS = ((0, 90), (90, 93), (93, 95), (95, 97), (97, 98), (98, 99), (99, 100))  # percent, PDD.md


class TraceError(ValueError):
    """A trace line is unreadable; the message names the file and line number."""


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of the workload.

    request_id: r0001... (w0 for the warm-up); session: s01.. f01.. g01.. or the trace's
    turn: 1-based turn in the session; kind: one of KINDS
    max_tokens: output tokens (every request runs to max_tokens)
    arrival_s: earliest send time, from the workload start (s)
    after: previous turn's request_id; the prompt is its prompt + its reply + head_tokens
    think_s: wait after `after` completes before sending (s)
    head_tokens: the whole prompt (no `after`) or the text appended after the previous turn
    prompt_len: the final prompt length (tokens)
    cached_tokens: expected DRC hit (tokens; block-aligned)
    """

    request_id: str
    session: str
    turn: int
    kind: str
    max_tokens: int
    arrival_s: float
    after: str | None
    think_s: float
    head_tokens: tuple[int, ...]
    prompt_len: int
    cached_tokens: int

    @property
    def expected_hit(self) -> float:
        return self.cached_tokens / self.prompt_len if self.prompt_len else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["head_tokens"] = list(self.head_tokens)
        return d

    @staticmethod
    def from_json(d: dict) -> WorkloadRequest:
        return WorkloadRequest(**{**d, "head_tokens": tuple(d["head_tokens"])})


def bucket_of(hit: float) -> str:
    """'95-97' etc. for a hit fraction (0..1); 100% falls in 99-100."""
    pct = hit * 100
    for lo, hi in HIT_BUCKETS:
        if pct < hi or hi == 100:
            if pct >= lo:
                return f"{lo}-{hi}"
    return f"{HIT_BUCKETS[0][0]}-{HIT_BUCKETS[0][1]}"


def bucket_names() -> list[str]:
    return [f"{lo}-{hi}" for lo, hi in HIT_BUCKETS]


def _aligned(n: int, block: int) -> int:
    return n // block * block


def _context_after(req: WorkloadRequest) -> int:
    """Tokens with KV on the MD once req finished: prompt + reply minus the last token (it has no KV)."""
    return req.prompt_len + req.max_tokens - 1


class _Gen:
    """Seeded synthetic generator (see the module docstring)."""

    def __init__(self, s, vocab: int, block: int, context: int, seed: int):
        self.s, self.vocab, self.block, self.context = s, vocab, block, context
        self.rng = random.Random(seed)
        self.system = self.tokens(s.system_prompt_tokens)
        self.system_cached = _aligned(s.system_prompt_tokens, block)

    def tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.vocab) for _ in range(n))

    def span(self, pair: tuple[int, int]) -> int:
        return self.rng.randint(pair[0], pair[1])

    def starter(self, kind: str, session: str) -> WorkloadRequest:
        s = self.s
        size, out = {
            "turn": (s.first_turn_tokens, s.output_tokens),
            "fresh": (s.fresh_tokens, s.output_tokens),
            "singular": (s.singular_tokens, s.singular_output_tokens),
        }[kind]
        head = self.system + self.tokens(self.span(size))
        max_tokens = min(self.span(out), self.context - len(head))
        return WorkloadRequest(
            "",
            session,
            1,
            kind,
            max_tokens,
            0.0,
            None,
            0.0,
            head,
            len(head),
            min(self.system_cached, _aligned(len(head) - 1, self.block)),
        )

    def next_turn(self, prev: WorkloadRequest) -> WorkloadRequest | None:
        s = self.s
        big = self.rng.random() < s.big_turn_fraction
        head = self.tokens(self.span(s.big_turn_tokens if big else s.turn_tokens))
        base = prev.prompt_len + prev.max_tokens
        max_tokens = self.span(s.output_tokens)
        if base + len(head) + max_tokens > self.context:
            return None
        think = self.rng.expovariate(1 / s.think_s_mean) if s.think_s_mean > 0 else 0.0
        return WorkloadRequest(
            "",
            prev.session,
            prev.turn + 1,
            "turn",
            max_tokens,
            0.0,
            "",
            round(think, 3),
            head,
            base + len(head),
            _aligned(_context_after(prev), self.block),
        )


def synthetic(s, vocab: int, block: int, context: int, seed: int) -> list[WorkloadRequest]:
    """The synthetic workload (module docstring), warm-up first; request ids in arrival order of starters."""
    g = _Gen(s, vocab, block, context, seed)
    starters = [("turn", f"s{i + 1:02d}") for i in range(s.sessions)]
    starters += [("fresh", f"f{i + 1:02d}") for i in range(s.fresh_requests)]
    sessions_total = s.sessions * (s.turns[0] + s.turns[1]) / 2 + s.fresh_requests
    n_singular = (
        0
        if s.singular_fraction == 0
        else max(1, round(sessions_total * s.singular_fraction / (1 - s.singular_fraction)))
    )
    starters += [("singular", f"g{i + 1:02d}") for i in range(n_singular)]
    g.rng.shuffle(starters)
    out, t, n = [_warmup(g)], 0.0, 0
    for kind, session in starters:
        t = next_arrival(t, s.session_rate_per_s, s.rate_steps, g.rng)
        first = g.starter(kind, session)
        n += 1
        chain = [_with(first, request_id=f"r{n:04d}", arrival_s=round(t, 3))]
        turns = g.span(s.turns) if kind == "turn" else 1
        while len(chain) < turns:
            nxt = g.next_turn(chain[-1])
            if nxt is None:
                break
            n += 1
            chain.append(_with(nxt, request_id=f"r{n:04d}", after=chain[-1].request_id))
        out += chain
    return out


def next_arrival(t: float, rate: float, steps: tuple[tuple[float, float], ...], rng: random.Random) -> float:
    """The next arrival after t of a Poisson process whose rate is `rate`, then each step's from its from_s on
    (piecewise constant; memoryless, so a draw that crosses a step is redrawn from the step at its rate)."""
    while True:
        current = rate
        for at, r in steps:
            if at <= t:
                current = r
        nxt = t + rng.expovariate(current)
        later = [at for at, _ in steps if t < at <= nxt]
        if not later:
            return nxt
        t = min(later)


def fixed_hit(f, vocab: int, block: int, context: int, seed: int) -> list[WorkloadRequest]:
    """One-turn requests of f.prompt_tokens whose first f.hit of the prompt (whole blocks) is one shared
    prefix, the rest new: after the warm-up (the prefix and a block), every prompt's hit is the same, at P
    and at the MD. Poisson arrivals at f.rate_per_s."""
    rng = random.Random(seed)
    shared = _aligned(int(f.hit * f.prompt_tokens), block)
    prefix = tuple(rng.randrange(vocab) for _ in range(shared))
    warm = prefix + tuple(rng.randrange(vocab) for _ in range(block))
    out = [WorkloadRequest("w0", "w", 1, "warmup", WARMUP_OUTPUT_TOKENS, 0.0, None, 0.0, warm, len(warm), 0)]
    t = 0.0
    for i in range(1, f.requests + 1):
        t += rng.expovariate(f.rate_per_s)
        head = prefix + tuple(rng.randrange(vocab) for _ in range(f.prompt_tokens - shared))
        max_tokens = min(rng.randint(*f.output_tokens), context - len(head))
        cached = min(shared, _aligned(len(head) - 1, block))
        out.append(
            WorkloadRequest(
                f"r{i:04d}", f"h{i:03d}", 1, "fresh", max_tokens, round(t, 3), None, 0.0, head, len(head), cached
            )
        )
    return out


def _warmup(g: _Gen) -> WorkloadRequest:
    head = g.system + g.tokens(g.block)
    return WorkloadRequest("w0", "w", 1, "warmup", WARMUP_OUTPUT_TOKENS, 0.0, None, 0.0, head, len(head), 0)


def _with(req: WorkloadRequest, **changes) -> WorkloadRequest:
    # replace, not asdict: asdict deep-copies head_tokens (~1,000 ints a request, ~6 s of a 10,000-request
    # workload); the tuple is immutable, so sharing it is the same request
    return replace(req, **changes)


# ---------------------------------------------------------------- traces

TRACE_KEYS = {"t_s", "session", "input_tokens", "token_ids", "output_tokens"}


def _trace_line(raw: str, where: str, vocab: int, context: int) -> dict:
    d = tracefile.parse(raw, where, TraceError)
    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected an object with keys {sorted(TRACE_KEYS)}; got {tracefile.shown(d)}")
    unknown = sorted(set(d) - TRACE_KEYS)
    if unknown:
        raise TraceError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(TRACE_KEYS)}")
    t = _required(d, "t_s", where)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: t_s must be a finite number >= 0 (arrival, s), got {tracefile.shown(t)}")
    out = _required(d, "output_tokens", where)
    if not isinstance(out, int) or isinstance(out, bool) or not 1 <= out < context:
        raise TraceError(f"{where}: output_tokens must be an int in [1, {context - 1}], got {tracefile.shown(out)}")
    if ("input_tokens" in d) == ("token_ids" in d):
        raise TraceError(f"{where}: exactly one of input_tokens or token_ids is required")
    if "token_ids" in d:
        _token_ids(d["token_ids"], out, where, vocab, context)
    elif not isinstance(d["input_tokens"], int) or isinstance(d["input_tokens"], bool) or d["input_tokens"] < 1:
        raise TraceError(f"{where}: input_tokens must be an int >= 1, got {tracefile.shown(d['input_tokens'])}")
    elif d["input_tokens"] + out > context:  # checked before any token is drawn
        n = d["input_tokens"]
        raise TraceError(f"{where}: prompt {n} + output {out} tokens exceed the model's context {context}")
    session = d.get("session", "")
    if not isinstance(session, str):
        raise TraceError(f"{where}: session must be a string, got {tracefile.shown(session)}")
    return d


def _required(d: dict, key: str, where: str):
    if key not in d:
        raise TraceError(f"{where}: missing key {key!r}")
    return d[key]


def _token_ids(ids, out: int, where: str, vocab: int, context: int) -> None:
    if not isinstance(ids, list) or not ids:
        raise TraceError(
            f"{where}: token_ids must be a non-empty list of ints in [0, {vocab}), got {tracefile.shown(ids)}"
        )
    if len(ids) + out > context:  # checked before the list is walked
        raise TraceError(f"{where}: prompt {len(ids)} + output {out} tokens exceed the model's context {context}")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise TraceError(f"{where}: token_ids[{i}] must be an int in [0, {vocab}), got {tracefile.shown(t)}")


def load_trace(path: Path, vocab: int, block: int, context: int, seed: int) -> list[WorkloadRequest]:
    """A JSON-lines trace -> requests (module docstring of the format in README); TraceError names the line.

    Line: {"t_s": arrival (s), "session": id ("" = none), "input_tokens": n | "token_ids": [...],
    "output_tokens": n}. In a session, input_tokens counts the whole prompt: the previous prompt and
    reply plus new tokens (so it must exceed them); the next turn waits for the previous reply.
    """
    rng = random.Random(seed)
    parsed = []
    for no, raw in tracefile.lines(path, TraceError):
        if raw.strip() and not raw.lstrip().startswith("#"):
            parsed.append((no, _trace_line(raw, f"{path}:{no}", vocab, context)))
    if not parsed:
        raise TraceError(f"{path}: no requests in the trace")
    parsed.sort(key=lambda x: x[1]["t_s"])
    last: dict[str, WorkloadRequest] = {}
    out = []
    for n, (no, d) in enumerate(parsed, 1):
        out.append(_trace_request(n, no, d, last, rng, vocab, block, context, f"{path}:{no}"))
        if d.get("session"):
            last[d["session"]] = out[-1]
    return out


def _trace_request(
    n: int, no: int, d: dict, last: dict, rng: random.Random, vocab: int, block: int, context: int, where: str
) -> WorkloadRequest:
    session, prev = d.get("session", ""), last.get(d.get("session", ""))
    rid, out = f"r{n:04d}", d["output_tokens"]
    if "token_ids" in d:
        head = tuple(d["token_ids"])
        prompt_len, after, cached = len(head), None, 0
    elif prev is not None:
        base = prev.prompt_len + prev.max_tokens
        if d["input_tokens"] <= base:
            raise TraceError(
                f"{where}: input_tokens={d['input_tokens']} must exceed the session's context so far "
                f"({prev.prompt_len} prompt + {prev.max_tokens} reply = {base})"
            )
        head = tuple(rng.randrange(vocab) for _ in range(d["input_tokens"] - base))
        prompt_len, after, cached = d["input_tokens"], prev.request_id, _aligned(_context_after(prev), block)
    else:
        head = tuple(rng.randrange(vocab) for _ in range(d["input_tokens"]))
        prompt_len, after, cached = len(head), None, 0
    if prompt_len + out > context:
        raise TraceError(f"{where}: prompt {prompt_len} + output {out} tokens exceed the model's context {context}")
    return WorkloadRequest(
        rid,
        session or f"t{n:04d}",
        (prev.turn + 1) if after else 1,
        "trace",
        out,
        float(d["t_s"]),
        after,
        0.0,
        head,
        prompt_len,
        cached,
    )


def _mooncake(path: Path, opts, vocab: int, block: int, context: int, seed: int) -> list[WorkloadRequest]:
    """A Mooncake FAST'25 trace's window (experiments.spec.mooncake) as one-turn requests of kind `trace`."""
    try:
        entries = mooncake.load(path, opts, vocab, block, context, seed)
    except mooncake.MooncakeError as err:
        raise TraceError(str(err)) from None
    return [
        WorkloadRequest(
            f"r{n:04d}",
            f"m{e.line}",
            1,
            "trace",
            e.max_tokens,
            e.arrival_s,
            None,
            0.0,
            e.tokens,
            len(e.tokens),
            e.cached_tokens,
        )
        for n, e in enumerate(entries, 1)
    ]


# ---------------------------------------------------------------- entry points


def context_of(spec) -> int:
    """The context every request is cut to (prompt + max_tokens): workload.synthetic.max_context_tokens, else
    spec.model's, also under modelled compute (the small model is the tokenizer and this cut)."""
    from workers.model import get_config

    return spec.workload.synthetic.max_context_tokens or get_config(spec.model).max_seq_len


def context_problem(spec, arch_context: int) -> str | None:
    """Why the workload's prompts leave no room for a token in context_of(spec) (a request would get max_tokens
    <= 0: build clips max_tokens to the context), or None. arch_context: what max_context_tokens may lift it to."""
    w, cut = spec.workload, context_of(spec)
    s = w.synthetic
    starters = {
        "fixed_hit": [("workload.fixed_hit.prompt_tokens", 0, w.fixed_hit.prompt_tokens)],
        "synthetic": [
            (f"workload.synthetic.{name}[1]", s.system_prompt_tokens, getattr(s, name)[1])
            for name, used in (
                ("first_turn_tokens", s.sessions),
                ("fresh_tokens", s.fresh_requests),
                ("singular_tokens", s.singular_fraction),
            )
            if used
        ],
    }.get(w.source, [])
    for field, system, tokens in starters:
        if system + tokens > cut - 1:
            plus = f" + {system} of system prompt" if system else ""
            return (
                f"{field}={tokens}{plus} leaves no output token in the {cut}-token context requests are cut to "
                f"(prompt + max_tokens); allowed: a prompt of at most {cut - 1}, or a larger "
                f"workload.synthetic.max_context_tokens (at most {arch_context}, the model's context)"
            )
    return None


def build(spec) -> list[WorkloadRequest]:
    """The spec's workload (synthetic or trace); raises TraceError / ValueError before anything starts."""
    from workers.model import get_config

    model = get_config(spec.model)
    w = spec.workload
    context = context_of(spec)
    if w.source in ("trace", "mooncake"):
        path = Path(w.trace)
        if not path.is_absolute():
            path = Path(__file__).resolve().parents[2] / path
        if w.source == "mooncake":
            return _mooncake(path, w.mooncake, model.vocab_size, spec.block_size, context, w.seed)
        return load_trace(path, model.vocab_size, spec.block_size, context, w.seed)
    if w.source == "fixed_hit":
        reqs = fixed_hit(w.fixed_hit, model.vocab_size, spec.block_size, context, w.seed)
    else:
        reqs = synthetic(w.synthetic, model.vocab_size, spec.block_size, context, w.seed)
    return reqs if w.warmup else [r for r in reqs if r.kind != "warmup"]


def write(requests: list[WorkloadRequest], path: Path) -> None:
    path.write_text("".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in requests))


def read(path: Path) -> list[WorkloadRequest]:
    return [WorkloadRequest.from_json(json.loads(line)) for line in Path(path).read_text().splitlines() if line]


def hit_profile(requests: list[WorkloadRequest]) -> dict:
    """Expected hit distribution of the measured requests: mean, share above 95%, per bucket counts."""
    measured = [r for r in requests if r.kind != "warmup"]
    hits = [r.expected_hit for r in measured]
    buckets = {b: 0 for b in bucket_names()}
    for h in hits:
        buckets[bucket_of(h)] += 1
    n = len(hits) or 1
    return {
        "requests": len(measured),
        "mean_hit": sum(hits) / n,
        "share_above_95": sum(h > 0.95 for h in hits) / n,
        "singular_share": sum(r.kind == "singular" for r in measured) / n,
        "buckets": buckets,
        "median_uncached_tokens": _median([r.prompt_len - r.cached_tokens for r in measured]),
    }


def _median(xs: list[float]) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
