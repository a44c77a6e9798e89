"""The order a run's variants run in: seeded, recorded, the reference variant first; or the spec's own."""

import dataclasses

from experiments.spec.order import run_order
from experiments.spec.experiment import load_spec


def test_shuffled_is_a_seeded_permutation_with_the_reference_first():
    spec = load_spec("pdd-vs-baselines")
    orders = {}
    for seed in range(1, 13):
        s = dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, seed=seed))
        order = run_order(s)
        assert order[0] == "colocated" and sorted(order) == sorted(spec.variants)
        assert run_order(s) == order  # the same seed, the same order
        orders[seed] = tuple(order)
    assert len(set(orders.values())) == 6  # every order of the three others occurs over the seeds
    for first in range(1, 7):  # any 6 consecutive seeds: each variant in each position once
        window = [orders[s] for s in range(first, first + 6) if s in orders]
        if len(window) == 6:
            assert all(len({o[pos] for o in window}) == 3 for pos in (1, 2, 3))


def test_as_listed_keeps_the_spec_order():
    spec = load_spec("pdd-vs-baselines", ["variant_order=as_listed"])
    assert run_order(spec) == list(spec.variants)


def test_the_order_seed_turns_the_order_on_one_workload_seed():
    spec = load_spec("pdd-vs-baselines")
    orders = {tuple(run_order(dataclasses.replace(spec, variant_order_seed=r))) for r in range(6)}
    assert len(orders) == 6 and {o[0] for o in orders} == {"colocated"}


def test_a_variant_that_kills_the_emulator_runs_last():
    """The WAN stays dead once the emulator is killed: that variant goes last whatever the seed."""
    defs = "variant_defs={a: {mode: pdd}, b: {mode: pdd}, c: {mode: pdd}}"
    spec = load_spec("pdd-smoke", [defs, "variants=[a, b, c]", "faults=[{kill: emulator, at_s: 4, variants: [c]}]"])
    orders = {tuple(run_order(dataclasses.replace(spec, variant_order_seed=r))) for r in range(4)}
    assert {o[-1] for o in orders} == {"c"} and len(orders) == 2
