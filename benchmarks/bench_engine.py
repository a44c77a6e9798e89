"""Engine microbenchmark: KV size, prefill vs matmul peak, decode and extend vs their bounds, chunked prefill.

Responsible for: measuring this machine (single-thread fp32 matmul FLOP/s,
memory bandwidth by a large tensor copy) and the engine on one CPU thread,
and printing one table with each number next to its bound, its target, its
value before and after the attention rework (BEFORE_AFTER_MS) or its
published counterpart:
prefill; decode steps at batch 1/8/32; extend 16/64/128; chunked prefill
(chunk size vs whole prompt; 1, 4 and 16 concurrent prompts one at a time vs
chunked and batched); the time per output token of 8 decoding sessions while
a long prompt is prefilled on the same engine, whole (stalling them) vs in
chunks mixed into their steps; the 100-token handoff.
Not responsible for: network effects (the PDD experiments).

    .venv/bin/python benchmarks/bench_engine.py [--config default] [--json out.json]

FLOP accounting (prefill of T tokens, causal): 2 * (matmul weights) * T for
the projections and MLPs, + 2 * T^2 * head_dim * n_head * n_layer for QK^T and
AV (each 2*T^2*hs per head, halved by the causal mask), + 2 * d_model * vocab
for the LM head on the last token only. Decode and extend have two bounds:
memory, the matmul weights (everything but the embedding table, which is only
indexed) read once per step at the copy bandwidth plus the batch's KV read
once; and compute, their matmul FLOPs (LM head on every row) at the measured
matmul peak. A step cannot beat the larger of the two.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from workers.chunked import DEFAULT_BUDGET_TOKENS, ChunkScheduler
from workers.engine import Engine, GenerationRequest

log = logging.getLogger("bench_engine")

MATMUL_N = 2048  # square fp32 matmul used to measure peak FLOP/s
COPY_BYTES = 256 * 2**20  # per tensor: src + dst = 512 MiB, beyond the L3 cache
PREFILL_TOKENS = 1024
DECODE_CONTEXT = 256  # tokens already in each request's KV during decode/extend
DECODE_BATCHES = (1, 8, 32)
EXTEND_TOKENS = (16, 64, 128)
HANDOFF_TOKENS = 100
PUBLISHED_HANDOFF = ("1.5 KB", "4649 KB")  # token IDs vs incremental KV, PDD.md
CHUNK_BUDGETS = (64, 128, 256, 512)  # tokens per step
CONCURRENT_PROMPTS = (1, 4, 16)
# prompt lengths, drawn uniformly: uncached suffixes of requests with high prefix hits, and of varied ones
CONCURRENT_PROMPT_TOKENS = ((4, 32), (16, 512))
SESSIONS = 8  # decoding while a long prompt is prefilled on the same engine
LONG_PROMPT_TOKENS = 2048  # or the model's context, whichever is smaller
SECTIONS = ("KV", "machine", "prefill", "decode", "extend", "chunked", "TPOT", "handoff")  # table order
# The default model before and after attention read KV in place (889ea78: every request's KV gathered into a
# padded batch per layer, then SDPA; weights row-major -> 6436be1), both engines timed alternately in one process:
# best of 5 paired rounds (ms) on this 2-core machine, others' jobs running. Load changes between sittings, so
# the pair is printed as measured, beside (not instead of) this run's own number.
BEFORE_AFTER = ("889ea78", "6436be1")
BEFORE_AFTER_MS = {"decode 1": (17.6, 12.9), "decode 8": (40.2, 37.9), "decode 32": (126.3, 96.1)}
BEFORE_AFTER_MS |= {"extend 16": (44.8, 46.1), "extend 64": (114.0, 111.1), "extend 128": (194.4, 193.1)}


@dataclass(frozen=True)
class Row:
    section: str
    metric: str
    value: float
    unit: str
    reference: str = ""


def timed(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Best wall time of fn (s) after warmup calls: on a shared machine the minimum is the
    run least disturbed by other processes, as for the peak measurements it is compared to."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def timed_pair(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best wall times (s) of a and b, run alternately after one warmup each: two variants compared under
    the same load, whatever else the machine runs meanwhile."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return min(times[0]), min(times[1])


def measure_matmul_flops(dtype: torch.dtype) -> float:
    """Single-thread FLOP/s of a large square matmul (best of 10)."""
    a = torch.randn(MATMUL_N, MATMUL_N).to(dtype)
    b = torch.randn(MATMUL_N, MATMUL_N).to(dtype)
    return 2 * MATMUL_N**3 / timed(lambda: a @ b, repeats=10)


def measure_copy_bandwidth() -> float:
    """Bytes moved per second (read + write) by a large tensor copy (best of 10)."""
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / timed(lambda: dst.copy_(src), repeats=10)


def matmul_weight_bytes(engine: Engine) -> int:
    model = engine.model
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("wte"))


def prefill_flops(engine: Engine, n_tokens: int) -> float:
    c = engine.config
    matmul_params = sum(
        p.numel() for n, p in engine.model.named_parameters() if n.startswith("blocks") and p.dim() == 2
    )
    attention = 2 * n_tokens**2 * c.head_dim * c.n_head * c.n_layer
    return 2 * matmul_params * n_tokens + attention + 2 * c.d_model * c.vocab_size


def random_tokens(engine: Engine, n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, engine.config.vocab_size, (n,), generator=gen).tolist())


class Bench:
    """Runs each section against one engine and collects rows."""

    def __init__(self, engine: Engine, flops: float, bandwidth: float):
        self.engine = engine
        self.flops = flops
        self.bandwidth = bandwidth
        self.rows: list[Row] = []
        self._ids = 0
        self.context = random_tokens(engine, DECODE_CONTEXT, seed=1)
        self.context_blob = self._context_blob()

    def add(self, *args) -> None:
        self.rows.append(Row(*args))

    def _rid(self) -> str:
        self._ids += 1
        return f"bench-{self._ids}"

    def _open(self, prompt: tuple[int, ...], max_tokens: int) -> str:
        rid = self._rid()
        self.engine.open(GenerationRequest(rid, prompt, max_tokens, use_prefix_cache=False))
        return rid

    def _context_blob(self) -> bytes:
        rid = self._open(self.context, 1)
        self.engine.prefill(rid)
        blob = self.engine.export_kv(rid, 0, DECODE_CONTEXT)
        self.engine.abort(rid)
        return blob

    def _open_with_context(self, max_tokens: int) -> str:
        """A request whose 256-token prompt KV is imported (cheaper than prefilling it again)."""
        rid = self._open(self.context, max_tokens)
        self.engine.import_kv(rid, self.context_blob)
        self.engine.append_tokens(rid, [7])
        return rid

    def kv_size(self) -> None:
        c = self.engine.config
        self.add(
            "KV",
            f"KV bytes per token ({c.name}, {c.dtype})",
            c.kv_bytes_per_token,
            "B",
            f"{c.n_layer} layers x 2 x {c.n_kv_head} kv heads x {c.head_dim} x {c.dtype_bytes} B; "
            "PDD.md: 10-80 KB, ~50 KB typical",
        )

    def machine(self) -> None:
        self.add("machine", "matmul, 1 thread", self.flops / 1e9, "GFLOP/s", f"{MATMUL_N}^3 {self.engine.config.dtype}")
        self.add(
            "machine",
            "memory bandwidth (copy, read+write)",
            self.bandwidth / 1e9,
            "GB/s",
            f"{2 * COPY_BYTES >> 20} MiB moved",
        )

    def prefill(self) -> None:
        prompt = random_tokens(self.engine, PREFILL_TOKENS, seed=2)

        def run() -> None:
            rid = self._open(prompt, 1)
            self.engine.prefill(rid)
            self.engine.abort(rid)

        t = timed(run, repeats=5)
        self.flops = max(self.flops, measure_matmul_flops(self.engine.config.torch_dtype))  # peak next to it
        achieved = prefill_flops(self.engine, PREFILL_TOKENS) / t
        self.add("prefill", f"prefill {PREFILL_TOKENS} tokens", t * 1e3, "ms")
        self.add("prefill", "prefill throughput", PREFILL_TOKENS / t, "tokens/s")
        self.add(
            "prefill",
            "prefill achieved",
            achieved / 1e9,
            "GFLOP/s",
            f"{achieved / self.flops:.0%} of matmul peak (target >= 50%)",
        )

    def decode(self) -> float:
        """Rows for decode steps at each batch size; returns the batch-1 step time (s)."""
        steps = {batch: self._time_decode(batch) for batch in DECODE_BATCHES}
        self.bandwidth = max(self.bandwidth, measure_copy_bandwidth())  # bound measured next to it
        weight_s = matmul_weight_bytes(self.engine) / self.bandwidth
        self.add(
            "decode",
            "weights read once (matmul weights)",
            weight_s * 1e3,
            "ms",
            f"{matmul_weight_bytes(self.engine) / 1e6:.0f} MB at copy bandwidth",
        )
        for batch, t in steps.items():
            memory_s = weight_s + batch * DECODE_CONTEXT * self.engine.kv_bytes_per_token / self.bandwidth
            compute_s = self.matmul_flops(batch, DECODE_CONTEXT) / self.flops
            target = " (target <= 2x weight read)" if batch == 1 else ""
            if batch == DECODE_BATCHES[-1]:
                target = f" (target <= 2x weights+KV: {2 * memory_s * 1e3:.1f} ms)"
            ref = (
                f"{t / weight_s:.2f}x weight read{target}; bounds: weights+KV {memory_s * 1e3:.1f} ms "
                f"({t / memory_s:.1f}x), matmul FLOPs {compute_s * 1e3:.1f} ms ({t / compute_s:.1f}x)"
            )
            self.add(
                "decode",
                f"decode step, batch {batch}, context {DECODE_CONTEXT}",
                t * 1e3,
                "ms",
                ref + self.before(f"decode {batch}"),
            )
        return steps[1]

    def matmul_flops(self, rows: int, context: int) -> float:
        """FLOPs of a pass of `rows` tokens (LM head on each) on `context` positions of KV each."""
        c = self.engine.config
        params = sum(p.numel() for n, p in self.engine.model.named_parameters() if p.dim() == 2 and n != "wte.weight")
        return 2 * params * rows + 4 * rows * context * c.n_head * c.head_dim * c.n_layer

    def before(self, key: str) -> str:
        """'; <before> -> <after> ms paired' for a default-model row measured across the attention rework."""
        if self.engine.config.name != "default" or key not in BEFORE_AFTER_MS:
            return ""
        (b, a), (before, after) = BEFORE_AFTER, BEFORE_AFTER_MS[key]
        return f"; {b} -> {a}, paired: {before:.1f} -> {after:.1f} ms"

    def _time_decode(self, batch: int) -> float:
        """Best time (s) of a decode step over `batch` requests with 256 tokens of context each."""
        rids = [self._open_with_context(16) for _ in range(batch)]
        t = timed(lambda: self.engine.decode_step(rids), repeats=12, warmup=2)
        for rid in rids:
            self.engine.abort(rid)
        return t

    def extend(self, step_b1: float) -> None:
        for k in EXTEND_TOKENS:
            ids = list(random_tokens(self.engine, k, seed=3 + k))
            t = min(self._time_extend(ids) for _ in range(5))
            compute_s = self.matmul_flops(k, DECODE_CONTEXT + k // 2) / self.flops
            target = " (target <= 3x)" if k == 64 else ""
            self.add(
                "extend",
                f"extend {k} tokens on context {DECODE_CONTEXT}",
                t * 1e3,
                "ms",
                f"{t / step_b1:.1f}x one decode step ({step_b1 * 1e3:.1f} ms){target}; matmul FLOPs alone "
                f"{compute_s * 1e3:.0f} ms = {compute_s / step_b1:.1f}x a step; {k} steps = {k * step_b1 * 1e3:.0f} ms"
                + self.before(f"extend {k}"),
            )
        ids = list(random_tokens(self.engine, 64, seed=3 + 64))
        t = min(self._time_extend(ids, all_logits=False) for _ in range(5))
        self.add(
            "extend",
            "extend 64 tokens, next token only",
            t * 1e3,
            "ms",
            f"{t / step_b1:.1f}x one decode step: the LM head on the last row only (what the MD's handoff needs)",
        )

    def _time_extend(self, ids: list[int], all_logits: bool = True) -> float:
        """Wall time (s) of one extend over ids on a fresh 256-token context (setup not timed)."""
        rid = self._open_with_context(len(ids) + 2)
        t0 = time.perf_counter()
        self.engine.extend(rid, ids, all_logits=all_logits)
        elapsed = time.perf_counter() - t0
        self.engine.abort(rid)
        return elapsed

    def chunk_sizes(self) -> None:
        """A prompt prefilled in chunks of each budget, against the whole prompt in one pass."""
        prompt = random_tokens(self.engine, PREFILL_TOKENS, seed=2)
        for budget in CHUNK_BUDGETS:
            whole, t = timed_pair(lambda: self._whole([prompt]), lambda: self._chunked([prompt], budget), repeats=3)
            self.add(
                "chunked",
                f"prefill {PREFILL_TOKENS} tokens in chunks of {budget}",
                PREFILL_TOKENS / t,
                "tokens/s",
                f"{whole / t:.0%} of the whole prompt's {PREFILL_TOKENS / whole:,.0f} tokens/s (timed alternately)",
            )

    def concurrent_prefill(self) -> None:
        """Prefill throughput of n prompts that arrive together: one at a time, whole, vs chunked + batched."""
        for lo, hi in CONCURRENT_PROMPT_TOKENS:
            lengths = torch.randint(lo, hi + 1, (max(CONCURRENT_PROMPTS),), generator=torch.Generator().manual_seed(5))
            for n in CONCURRENT_PROMPTS:
                prompts = [random_tokens(self.engine, int(m), seed=100 + i) for i, m in enumerate(lengths[:n])]
                tokens = sum(len(p) for p in prompts)
                whole, chunked = timed_pair(
                    lambda: self._whole(prompts), lambda: self._chunked(prompts, DEFAULT_BUDGET_TOKENS), repeats=3
                )
                sched = self._chunked(prompts, DEFAULT_BUDGET_TOKENS)
                what = f"{n} concurrent prompts of {lo}-{hi} tokens"
                self.add("chunked", f"{what}, whole, one at a time", tokens / whole, "tokens/s", f"{tokens} tokens")
                self.add(
                    "chunked",
                    f"{what}, chunked + batched",
                    tokens / chunked,
                    "tokens/s",
                    f"{whole / chunked:.2f}x; budget {DEFAULT_BUDGET_TOKENS}: {sched.steps} steps, "
                    f"{sched.lone_tail_steps} with a lone tail chunk",
                )

    def _whole(self, prompts: list[tuple[int, ...]]) -> None:
        for p in prompts:
            rid = self._open(p, 1)
            self.engine.prefill(rid)
            self.engine.abort(rid)

    def _chunked(self, prompts: list[tuple[int, ...]], budget: int) -> ChunkScheduler:
        rids = [self._open(p, 1) for p in prompts]
        sched = ChunkScheduler(self.engine, budget)
        for rid in rids:
            sched.submit(rid)
        while sched.step() is not None:
            pass
        for rid in rids:
            self.engine.abort(rid)
        return sched

    def tpot_under_prefill(self) -> None:
        """Time per output token of SESSIONS decoding sessions while a long prompt is prefilled on the same engine:
        whole between two of their steps (they stall), or in chunks mixed into their steps."""
        n = min(LONG_PROMPT_TOKENS, self.engine.config.max_seq_len - 1)
        prompt = random_tokens(self.engine, n, seed=6)
        alone = self._time_decode(SESSIONS)
        what = f"{n}-token prompt" + ("" if n == LONG_PROMPT_TOKENS else " (the model's context)")
        runs = {mode: [] for mode in ("whole", "chunked")}
        for _ in range(3):  # alternately, so both modes see the same load
            for mode, out in runs.items():
                out.append(self._sessions_during_prefill(prompt, mode == "chunked"))
        for mode, mode_runs in runs.items():
            gaps = sorted(g for run in mode_runs for g in run[0])
            worst = sorted(max(run[0]) for run in mode_runs)[1]  # median of the 3 runs' worst gaps
            ttft = sorted(run[1] for run in mode_runs)[1]
            how = (
                "prefilled whole between two steps"
                if mode == "whole"
                else f"in chunks of {DEFAULT_BUDGET_TOKENS} tokens with their steps"
            )
            what_mode = f"{SESSIONS} sessions, {what} {mode}"
            self.add(
                "TPOT",
                f"{what_mode}: worst TPOT",
                worst * 1e3,
                "ms",
                f"{how} (median of 3); a step of {SESSIONS} alone: {alone * 1e3:.1f} ms",
            )
            self.add(
                "TPOT",
                f"{what_mode}: median TPOT",
                gaps[len(gaps) // 2] * 1e3,
                "ms",
                f"while the prompt is prefilled ({len(gaps) // 3} steps)",
            )
            self.add(
                "TPOT",
                f"{what_mode}: prompt's TTFT",
                ttft * 1e3,
                "ms",
                "median of 3: its prefill, from arrival to first token",
            )

    def _sessions_during_prefill(self, prompt: tuple[int, ...], chunked: bool) -> tuple[list[float], float]:
        """The sessions' inter-token gaps (s) while the prompt is prefilled, and its time to first token (s)."""
        steps = len(prompt) // max(1, DEFAULT_BUDGET_TOKENS - SESSIONS) + 4
        sessions = [self._open_with_context(steps + 4) for _ in range(SESSIONS)]
        self.engine.decode_step(sessions)
        last = time.perf_counter()
        rid = self._open(prompt, 1)
        gaps = []
        if chunked:
            sched = ChunkScheduler(self.engine, DEFAULT_BUDGET_TOKENS)
            sched.submit(rid)
            while sched.waiting:
                sched.step(decode=sessions)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
            ttft = sum(gaps)
        else:
            self.engine.prefill(rid)
            ttft = time.perf_counter() - last
            self.engine.decode_step(sessions)
            gaps.append(time.perf_counter() - last)
        for r in sessions + [rid]:
            self.engine.abort(r)
        return gaps, ttft

    def handoff(self) -> None:
        ids = list(random_tokens(self.engine, HANDOFF_TOKENS, seed=4))
        recompute_s = min(self._time_extend(ids) for _ in range(3))
        rid = self._open_with_context(HANDOFF_TOKENS + 2)
        self.engine.extend(rid, ids)
        export_s = timed(lambda: self.engine.export_kv(rid, DECODE_CONTEXT, DECODE_CONTEXT + HANDOFF_TOKENS), 3)
        blob = self.engine.export_kv(rid, DECODE_CONTEXT, DECODE_CONTEXT + HANDOFF_TOKENS)
        self.engine.abort(rid)
        self.add(
            "handoff",
            f"{HANDOFF_TOKENS} tokens as token IDs (int32)",
            HANDOFF_TOKENS * 4 / 1e3,
            "KB",
            f"JSON list: {len(json.dumps(ids)) / 1e3:.2f} KB; published {PUBLISHED_HANDOFF[0]}",
        )
        self.add(
            "handoff",
            f"{HANDOFF_TOKENS} tokens as exported KV blob",
            len(blob) / 1e3,
            "KB",
            f"published {PUBLISHED_HANDOFF[1]}; export took {export_s * 1e3:.1f} ms",
        )
        self.add(
            "handoff",
            f"MD recompute: extend {HANDOFF_TOKENS} tokens",
            recompute_s * 1e3,
            "ms",
            "published 305 ms mean (token IDs + recompute)",
        )


def print_table(rows: list[Row]) -> None:
    width = max(len(r.metric) for r in rows)
    section = None
    for r in sorted(rows, key=lambda r: SECTIONS.index(r.section)):  # stable: keeps order within a section
        if r.section != section:
            section = r.section
            print(f"\n[{section}]")
        value = f"{r.value:,.1f}" if r.value < 1e6 else f"{r.value:,.0f}"
        print(f"  {r.metric:<{width}}  {value:>12} {r.unit:<9} {r.reference}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default", help="model config name (workers.model.CONFIGS)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    engine = Engine(
        args.config,
        seed=args.seed,
        device="cpu",
        prefix_cache=False,
        capacity_tokens=max(PREFILL_TOKENS, 40 * (DECODE_CONTEXT + 16)),
    )
    log.info("measuring matmul FLOP/s and memory bandwidth")
    bench = Bench(engine, measure_matmul_flops(engine.config.torch_dtype), measure_copy_bandwidth())
    bench.kv_size()
    log.info("prefill")
    bench.prefill()
    log.info("decode")
    step_b1 = bench.decode()
    log.info("extend")
    bench.extend(step_b1)
    log.info("chunked prefill")
    bench.chunk_sizes()
    bench.concurrent_prefill()
    log.info("TPOT while a long prompt is prefilled")
    bench.tpot_under_prefill()
    bench.handoff()
    bench.machine()  # the best of the measurements taken before and during the sections
    print(
        f"\nEngine benchmark: config {engine.config.name}, {engine.model.num_params() / 1e6:.1f}M params, "
        f"1 CPU thread, torch {torch.__version__}"
    )
    print_table(bench.rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in bench.rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
