"""The order a spec's variants run in: pure logic on the spec, so a sweep, a test or the runner gets the same
answer without a testbed."""

from __future__ import annotations

import itertools
import random

from experiments.spec import faults as specfaults
from experiments.spec.experiment import ExperimentSpec

REFERENCE_VARIANT = "colocated"  # its replies stand in for a later variant's failed turns (loadgen --reference)


def run_order(spec: ExperimentSpec) -> list[str]:
    """The order the variants run in (spec.variant_order). shuffled: one of the orders of the variants, picked
    by variant_order_seed (else the workload's seed) from a fixed shuffled list of all of them, so the same spec
    and seed run in the same order and any n! consecutive seeds (a sweep's repeats: it sets the repeat's index,
    so repeats on one workload seed turn too) run every order once: each variant in each position equally
    often; the reference variant first where it runs, and a variant that kills the emulator last (the WAN stays
    dead after it; spec.faults allows that kill in the spec's last variant only). as_listed: the spec's own
    order."""
    if spec.variant_order == "as_listed":
        return list(spec.variants)
    first = [v for v in spec.variants if v == REFERENCE_VARIANT]
    last = [v for v in spec.variants if v not in first and _kills_the_wan(spec, v)]
    orders = sorted(itertools.permutations(v for v in spec.variants if v not in first + last))
    random.Random("pddlab-variant-order").shuffle(orders)
    seed = spec.workload.seed if spec.variant_order_seed is None else spec.variant_order_seed
    return first + list(orders[seed % len(orders)]) + last


def _kills_the_wan(spec: ExperimentSpec, variant: str) -> bool:
    return any(f.kill == "emulator" for f in specfaults.for_variant(spec.faults, variant))
