"""Step and KV-import times of a real-compute run (the small model on this CPU) as the emulated runs measured them.

Responsible for: `MeasuredRoofline`, the catalogue's `this-machine` roofline of the spec's small model scaled to
the times the emulated pdd-vs-baselines runs measured on this machine (docs/simulator.md, "Validation"), with
the engine's chunked prefill (prefill.step_budget_tokens per step, a fixed cost each) and a KV export that
overlaps the prefill (the engine streams it while it computes) and an import that does not.
Not responsible for: modelled compute (workers.modelled.roofline as it stands) or the line (experiments.sim.wan).

Why scale at all: `this-machine` was fitted by benchmarks/bench_roofline.py with one engine alone on the CPU. In
an emulated run P, the RLD and the MD (each a process, one torch thread), the router, the client, the KV
senders and the line's shaping share two cores, so every step takes longer than the lone engine's, and each
engine step has a fixed cost the benchmark's engine did not pay (gRPC, Python, the pass over the cached KV).
The constants below take their shape from the events of the twelve runs kept with them (`scripts/validate_sim.py
fit RUN...`: medians and least-absolute-deviation fits over every event but the warm-up's) and their level from
the 23-29 runs of the profile matrices in docs/runs (P: its busy time, `p-level`; the decode worker: the TPOT,
`decode-level`): one set for every real-compute spec, tuned to no profile; a decode worker whose variant's P sends
KV over the WAN is slower by DECODE_WAN_SLOWDOWN. Each P step's time is also drawn about its constant (StepJitter:
P_STEP_SIGMA, P_STEP_LAG1), as the emulated P's steps spread. Each constant's comment names its command and n.

Contention (`Contention`, docs/simulator.md "A contention model (2026-12-05/06)"): each variant's workers take
those pooled times x (1 + ENGINE_SLOWDOWN per other engine of the pools its mode uses + WAN_SENDER_SLOWDOWN per P
worker that sends KV over the WAN) / POOLED_SLOWDOWN, the count derived from the spec by experiments.sim.config.
Not adopted: the constants below are neutral (every figure as before). Fitted on the six runs of the 2026-12-05/06
profile matrix (ENGINE 0, WAN_SENDER 0.435, POOLED 1.249), out of sample on the 17 older runs it took colocated's
pooled TTFT p50 from +41% to +11% but pd-intra's from -1% to -27% (below the runs' interval) and pd-cross on
wan-regional below its runs' interval: one firm error traded for another. What the count misses: the WAN sender's
load grows with the line's rate (P's steps in pd-cross: 1.1x the roofline on wan-congested, 7.5x on
wan-regional), and the data put the engine term at zero.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from workers.modelled.catalogue import Accelerator, ModelArch
from workers.modelled.roofline import Part, Roofline, StepCost

# P's prefill step: seconds = 0.1355 + 1.278 x roofline (docs/simulator.md, "P's step time (2026-12-06)"). The
# shape: `validate_sim.py fit --variants pd-intra,pdd` over the events of the six runs of the 2026-12-05/06
# profile matrix (p1 prefill_step: duration_ns against the roofline of the step's chunks; n=533, LAD fit):
# 0.0882 + 0.832x. The level: x 1.536, `validate_sim.py p-level` over the 23 runs of the four profile matrices in
# docs/runs (pd-intra and pdd: the median of the emulated P's busy time over the simulated P's; the simulator runs
# the emulated P's steps one to one, so they differ by the steps' level alone). pd-cross is left out of both: its
# P's steps carry the whole prompt's KV sender over the WAN (1.1-7.5x the roofline as the line is slow or fast),
# what Contention's WAN_SENDER_SLOWDOWN (not adopted) is for. The constants before (0.203 + 2.29x, fitted on the
# three 2026-12-04 runs, every variant pooled) gave a P 1.6x slower than the runs' median in pd-intra.
P_STEP_FIXED_S = 0.1355
P_STEP_FACTOR = 1.278
# P's step spread (docs/simulator.md, "P's step spread (2026-12-06)"): each simulated P step's time above x a
# seeded, mean-preserving lognormal factor, AR(1) in log space step to step (StepJitter). Fitted by
# `validate_sim.py p-spread` over the events of the twelve 2026-12-05/06 runs (/tmp/pm, /tmp/pm2; pd-intra and pdd,
# p1 prefill_step: log(measured / the time above for the same chunks), each run and variant's median taken out;
# n=1,067): sigma 0.32 (pd-intra 0.29, pdd 0.35; q05 / q95 -0.48 / +0.59, skew 0.19: near normal), lag-1
# correlation 0.27 within runs (pd-intra 0.20, pdd 0.33). The emulated P's steps spread as its two cores are shared
# with the RLD, the MD, the KV senders and the router; a P whose steps spread queues more (Kingman) than one whose
# step has one time per size.
P_STEP_SIGMA = 0.32
P_STEP_LAG1 = 0.27
# The decode worker's constants (docs/simulator.md, "The decode worker's constants (2026-12-06)"): the mixed step (a
# decode step with a local prefill or an extend in it) = MIXED_STEP_FIXED_S + MIXED_STEP_FACTOR x roofline, a decode
# step DECODE_FACTOR x roofline, the KV import IMPORT_PER_TOKEN_S a token. The shape: `validate_sim.py fit
# --variants colocated,pd-intra` over the events of the 12 runs of profile-matrix-20261206 and -20261206b (their P
# sends no KV over the WAN; mixed: rld1/md1 decode_step_mixed with chunk_tokens > 1, 0.0122 + 0.683x, n=533, LAD;
# decode: (decode_done - first_token) / steps against the roofline of mean_batch sessions at 700 tokens, median
# 0.478x, n=955; import: kv_imported - kv_recv_end, 0.0344 ms a token through zero, n=504: the imports span only
# 626-955 tokens, and the free fit's fixed cost is negative). The level: x 1.667, `validate_sim.py decode-level`
# over the 29 runs of the five profile matrices in docs/runs (colocated and pd-intra: the median of emulated /
# simulated TPOT p50; the summaries keep no decode busy time; 1.011 rerun). The constants before (0.068 + 1.12x,
# 1.77x, 24.5 ms + 0.0838 ms a token) were fitted on three slow 2026-12-04 runs pooled over every variant and gave
# a TPOT 2.5x the runs' median (decode-level 0.404) and colocated's TTFT p50 / p90 +72% / +101% over the 29 runs.
# Adopted once the simulator kept the MD's in-flight DRC: before it, these constants doubled pdd's WAN bytes on
# wan-cellular-trace (+112% -> +369%); with it +0% -> +6% (mean of 4 seeds).
MIXED_STEP_FIXED_S = 0.0204
MIXED_STEP_FACTOR = 1.139
DECODE_FACTOR = 0.797
IMPORT_FIXED_S = 0.0
IMPORT_PER_TOKEN_S = 0.0000573
# The export: P streams the KV while it computes (events p1: kv_send_start 20-25 ms after prefill_start,
# the fast path's kv_send_end 2-5 ms after prefill_done), so nothing is added after the prefill.
EXPORT_S = 0.0
# Contention (to be fitted: validate_sim fit, "the count model").
ENGINE_SLOWDOWN = 0.0  # each other engine of the variant's pools adds this share to every step and import
WAN_SENDER_SLOWDOWN = 0.0  # each P worker sending KV over the WAN adds this share
POOLED_SLOWDOWN = 1.0  # the slowdown the pooled constants above carry (the fit's events' mean): divided out
# A decode worker's times (its steps and imports) where its variant's P sends KV over the WAN (pd-cross, pdd): their
# runs decode 1.3x slower than colocated's and pd-intra's, whose steps the constants above were fitted on
# (`validate_sim.py decode-level --variants pd-cross,pdd` with them: 1.293; 1.006 rerun).
DECODE_WAN_SLOWDOWN = 1.293


@dataclass(frozen=True)
class Contention:
    """What shares this machine's two cores with a worker's engine in one variant (experiments.sim.config derives
    it from the spec: the pools its mode uses, and whether it sends KV over the WAN).

    engines: the engine processes of the pools the variant's mode uses, the worker's own included (colocated: the
    RLD pool; pd-intra: P and RLD; pd-cross: P and MD; pdd: P, RLD and MD); wan_senders: the P workers whose
    processes send KV over the WAN (pd-cross, pdd: the P pool; their sender threads take cores and the GIL)"""

    engines: int = 1
    wan_senders: int = 0

    @property
    def slowdown(self) -> float:
        """Every step and import of the variant's workers against the pooled constants': 1 + ENGINE_SLOWDOWN per
        other engine + WAN_SENDER_SLOWDOWN per WAN sender, over the POOLED_SLOWDOWN the constants carry."""
        return (1 + ENGINE_SLOWDOWN * (self.engines - 1) + WAN_SENDER_SLOWDOWN * self.wan_senders) / POOLED_SLOWDOWN


class MeasuredRoofline(Roofline):
    """The roofline of `model` on `accelerator` (this-machine), its times scaled to the emulated runs' (module
    docstring). prefill_worker: True for a P worker (its steps are P's), False for an RLD or MD; chunk_tokens:
    the engine's prefill.step_budget_tokens (a prompt's new tokens take ceil(n / chunk_tokens) steps);
    contention: what shares the cores with it in its variant (every time below x contention.slowdown)."""

    def __init__(
        self,
        accelerator: Accelerator,
        model: ModelArch,
        devices: int = 1,
        *,
        prefill_worker: bool,
        chunk_tokens: int = 256,
        contention: Contention = Contention(),
    ):
        super().__init__(accelerator, model, devices)
        self.prefill_worker, self.chunk_tokens = prefill_worker, max(1, chunk_tokens)
        self.contention, self.slowdown = contention, contention.slowdown
        if not prefill_worker and contention.wan_senders:
            self.slowdown *= DECODE_WAN_SLOWDOWN
        self.decode_factor = DECODE_FACTOR * self.slowdown

    @property
    def bytes_per_s(self) -> float:
        """The lone engine's bandwidth / (DECODE_FACTOR x slowdown): a decode step (and
        experiments.sim.workers.DecodeCost, which reads this) takes that many times the roofline's."""
        return super().bytes_per_s / self.decode_factor

    def step_flops_per_s(self, tokens: int) -> float:
        return super().step_flops_per_s(tokens) / self.decode_factor

    def step(self, parts: Sequence[Part]) -> StepCost:
        """A decode step: DECODE_FACTOR x slowdown x the roofline's (through the rates above, the overhead scaled
        too); a step with a prefill or an extend in it: per chunk of chunk_tokens the measured fixed cost, plus the
        measured factor x the lone roofline's time, both x slowdown."""
        cost = super().step(parts)
        cost = replace(cost, overhead_s=cost.overhead_s * self.decode_factor)
        # the fixed cost was fitted per engine step of chunk_tokens: parts sharing a step (one prompt's tail chunk
        # with the next one's first) pay it once, a whole prompt in one part once per chunk it would take
        chunks = math.ceil(sum(p.new_tokens for p in parts if p.new_tokens > 1) / self.chunk_tokens)
        if not chunks:
            return cost
        fixed, factor = (
            (P_STEP_FIXED_S, P_STEP_FACTOR) if self.prefill_worker else (MIXED_STEP_FIXED_S, MIXED_STEP_FACTOR)
        )
        lone = factor / DECODE_FACTOR  # the rates above already carry DECODE_FACTOR x slowdown
        return StepCost(
            cost.flops,
            cost.bytes,
            cost.compute_s * lone,
            cost.memory_s * lone,
            cost.overhead_s * lone + fixed * chunks * self.slowdown,
        )

    def kv_export_s(self, n_tokens: int) -> float:
        """Exporting n_tokens of KV after the prefill: EXPORT_S (streamed during it)."""
        return EXPORT_S

    def kv_import_s(self, n_tokens: int) -> float:
        """Importing n_tokens of KV on a decode worker (s): the measured fixed cost and per-token cost x slowdown."""
        return (IMPORT_FIXED_S + IMPORT_PER_TOKEN_S * n_tokens) * self.slowdown


class StepJitter:
    """The factors of a P's steps by their ordinal (the worker's k-th step run: factor(k)), lognormal with mean 1:
    exp(y_k - sigma^2 / 2), y an AR(1) in log space (y_k = lag1 y_(k-1) + sqrt(1 - lag1^2) sigma e_k, stationary
    N(0, sigma^2)). A step's factor is drawn once, so a plan made again over the same steps gets the same ones.
    rng: its own (a per-worker random.Random from the simulation's seed: the_jitter)."""

    def __init__(self, sigma: float, lag1: float, rng: random.Random):
        self.sigma, self.lag1, self.rng = sigma, lag1, rng
        self._innovation = math.sqrt(1 - lag1 * lag1) * sigma
        self._y = rng.gauss(0.0, sigma)  # y_0: the stationary law, so the first steps spread as the later ones
        self._factors = [math.exp(self._y - sigma * sigma / 2)]
        self._first = 0  # the ordinal of _factors[0] (those below were dropped: forget)

    def __call__(self, k: int) -> float:
        """Step k's factor (k >= the last forget's)."""
        factors, i = self._factors, k - self._first
        while len(factors) <= i:
            self._y = self.lag1 * self._y + self.rng.gauss(0.0, self._innovation)
            factors.append(math.exp(self._y - self.sigma * self.sigma / 2))
        return factors[i]

    def forget(self, k: int) -> None:
        """Steps below k ran: their factors are no longer asked for."""
        n = min(k - self._first, len(self._factors))  # only drawn ones: the AR(1) goes on from the last
        if n > 0:
            del self._factors[:n]
            self._first += n


def the_jitter(roofline: Roofline, seed: int, worker: str) -> StepJitter | None:
    """A P worker's step factors: real compute's (P_STEP_SIGMA, P_STEP_LAG1), from its own random.Random seeded by
    the simulation's seed and the worker's name (a string seed: the same draws in every process); None for
    modelled compute or sigma 0 (the steps' times as the roofline's, exactly)."""
    if not (isinstance(roofline, MeasuredRoofline) and roofline.prefill_worker and P_STEP_SIGMA > 0):
        return None
    return StepJitter(P_STEP_SIGMA, P_STEP_LAG1, random.Random(f"p-step-jitter/{seed}/{worker}"))


def kv_export_s(roofline: Roofline, n_tokens: int) -> float:
    """Export time of n_tokens of KV from a worker: measured (real compute) or the host link's (modelled)."""
    return (
        roofline.kv_export_s(n_tokens) if isinstance(roofline, MeasuredRoofline) else roofline.kv_transfer_s(n_tokens)
    )


def kv_import_s(roofline: Roofline, n_tokens: int) -> float:
    """Import time of n_tokens of KV into a worker: measured (real compute) or the host link's (modelled)."""
    return (
        roofline.kv_import_s(n_tokens) if isinstance(roofline, MeasuredRoofline) else roofline.kv_transfer_s(n_tokens)
    )
