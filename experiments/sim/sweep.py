"""`pddlab simulate SPEC --sweep KEY=V1,V2,... [--sweep ...]`: a spec simulated over a grid, one table row per point
and variant.

Responsible for: the axes (`experiments.run.sweep.parse_over`'s syntax and checks, spelt `--sweep`; a key the
spec, its profile or the catalogue does not have is refused, named, before anything runs); the grid (the axes'
product); each point's spec (spec fields as `--set`; `link.` / `a_to_b.` / `b_to_a.` fields as a derived profile,
`experiments.run.sweep`'s; `price.ACCELERATOR`: a price per device-hour, which reprices the point's simulated
records without simulating again); per point and variant: goodput under the spec's SLO, cost per hour, BCR
(requests meeting the SLO per USD) and BCR over the same-room homogeneous PD variant (experiments.analysis.cost's
reference), TTFT p50 / p90, SLO attainment, the RLD's token share, P's hit and the MD's (the ablation's DRC falls
behind), the share of requests finished on the RLD, the RLD's requests in flight over each third of the arrivals
(its load against time) and the last third's TTFT p50 (the load's highest step: where an ablation's collapse
shows); the cheapest (point, variant) whose SLO attainment reaches `--sla` (default 0.9); sweep.json and sweep.md
in the output directory, one progress line a point.
Not responsible for: simulating (experiments.sim.simulate) or the intervals of an emulated analysis (a sweep's
rows are point estimates: `pddlab simulate` on one point gives them).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from experiments.analysis import cost
from experiments.analysis.metrics import meets_slo, percentile
from experiments.analysis.records import RequestRecord
from experiments.run import sweep as emulated
from experiments.spec.experiment import ExperimentSpec, SpecError, to_dict
from topology.profiles import DIRECTIONS, LinkParams, ProfileError

PRICE = "price."  # price.<accelerator>=USD per device-hour: a repricing, not a simulation
ON_RLD = ("p-rld", "p-rld-ablation", "p-rld-singular", "p-rld-fallback", "colocated")  # routes that end on the RLD
SLA_ATTAINMENT = 0.9  # a (point, variant) meets the SLA when this share of its requests meets every SLO


class SimSweepError(ValueError):
    """A bad --sweep: the message names the key."""


def parse_axes(items: list[str]) -> tuple[emulated.Axis, ...]:
    """Each `--sweep KEY=V1,V2,...` as `pddlab sweep`'s --over reads it; a key swept twice refused."""
    axes = []
    for item in items:
        try:
            axes.append(emulated.parse_over(item))
        except emulated.SweepError as err:
            raise SimSweepError(str(err).replace("--over", "--sweep")) from None
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise SimSweepError(f"--sweep: a key is swept twice ({keys})")
    return tuple(axes)


def check_keys(axes: tuple[emulated.Axis, ...], accelerators: list[str]) -> None:
    """Each axis key a spec field, a profile field or price.<an accelerator of the catalogue>; prices numbers."""
    spec_fields = [f.name for f in dataclasses.fields(ExperimentSpec)]
    link_fields = [f.name for f in dataclasses.fields(LinkParams)]
    for a in axes:
        head, _, rest = a.key.partition(".")
        if a.key.startswith(PRICE):
            if rest not in accelerators:
                raise SimSweepError(f"--sweep {a.key}: no accelerator {rest!r} to price; allowed: {accelerators}")
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in a.values):
                raise SimSweepError(f"--sweep {a.key}: prices are positive numbers (USD/h), got {list(a.values)}")
        elif head in ("link", *DIRECTIONS):
            if rest not in link_fields:
                raise SimSweepError(f"--sweep {a.key}: unknown profile field {rest!r}; allowed: {link_fields}")
        elif head not in spec_fields:
            raise SimSweepError(
                f"--sweep {a.key}: unknown key; allowed: price.ACCELERATOR, link.FIELD / a_to_b.FIELD / "
                f"b_to_a.FIELD, or a spec field ({', '.join(spec_fields)}, dotted as in --set)"
            )


def grid(axes: tuple[emulated.Axis, ...]) -> list[dict[str, Any]]:
    """Every point: key -> value, the axes' product in order (the last axis turning fastest)."""
    keys = [a.key for a in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(a.values for a in axes))]


def simulated(values: dict[str, Any]) -> tuple:
    """What a point's simulation depends on (its values less the prices): points equal here share one."""
    return tuple((k, v) for k, v in values.items() if not k.startswith(PRICE))


def overrides(values: dict[str, Any], base_profile: str, scratch: Path, name: str) -> list[str]:
    """The point's --set items: spec fields as they are, profile fields as a derived profile file under
    scratch (experiments.run.sweep's), prices none."""
    out, fields = [], {}
    for k, v in values.items():
        if k.startswith(PRICE):
            continue
        if k.split(".", 1)[0] in ("link", *DIRECTIONS):
            fields[k] = v
        else:
            out.append(f"{k}={json.dumps(v)}")  # JSON is YAML
    if fields:
        plan = emulated.Plan(base_profile, (), base_profile, None, (), 1)
        try:
            path = emulated._derived_profile(plan, base_profile, fields, scratch / f"{name}.yaml")
        except (emulated.SweepError, ProfileError) as err:
            raise SimSweepError(str(err).replace("--over", "--sweep")) from None
        out.append(f"profile={path}")
    return out


def variant_row(recs: list[RequestRecord], slo, per_hour: float | None) -> dict:
    """One variant's figures at one point, from its simulated records (point estimates)."""
    ok = [r for r in recs if r.ok]
    t0 = min((r.t_send_ns for r in recs), default=0)
    dur = (max((r.t_done_ns for r in recs), default=0) - t0) / 1e9
    good = sum(meets_slo(r, slo) for r in ok)
    goodput = good / dur if dur > 0 else None
    ttft = [r.ttft_ms if r.ok and r.ttft_ms is not None else float("inf") for r in recs]
    out_tokens = sum(r.output_tokens for r in ok)
    routed = [r for r in recs if r.route]
    sent = (max((r.t_send_ns for r in recs), default=0) - t0) / 1e9  # the arrivals' span: the load's last third
    last = [r for r in recs if r.t_send_ns >= t0 + 2 / 3 * sent * 1e9]
    last_ttft = [r.ttft_ms if r.ok and r.ttft_ms is not None else float("inf") for r in last]
    # the RLD's load against time: each third of the arrivals (the load's steps, where a spec has three)
    thirds = [_in_flight(recs, t0 + k / 3 * sent * 1e9, t0 + (k + 1) / 3 * sent * 1e9) for k in range(3)]
    return {
        "requests": len(recs),
        "completed": len(ok),
        "goodput_rps": goodput,
        "slo_attainment": good / len(recs) if recs else None,
        "per_hour": per_hour,
        "bcr": cost.bcr(goodput, per_hour),
        "goodput_per_cost_hour": goodput / per_hour if goodput is not None and per_hour else None,
        "ttft_p50_ms": percentile(ttft, 50) if ttft else None,
        "ttft_p90_ms": percentile(ttft, 90) if ttft else None,
        "rld_token_share": sum(r.rld_tokens for r in ok) / out_tokens if out_tokens else None,
        "on_rld": _mean([100.0 * (r.route in ON_RLD) for r in routed]),
        "p_hit": _mean([100.0 * r.expected_hit for r in routed if r.expected_hit is not None]),
        "md_hit": _mean([100.0 * r.md_cached_tokens / r.prompt_tokens for r in routed if r.prompt_tokens]),
        "rld_in_flight_last_third": thirds[2],
        "rld_in_flight_by_third": thirds,
        "ttft_p50_last_third_ms": percentile(last_ttft, 50) if last_ttft else None,
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _in_flight(recs: list[RequestRecord], lo: float, hi: float) -> float | None:
    """Mean number of requests decoding on an RLD over [lo, hi) (ns): each from its send to its end, weighted by
    its overlap (a request with RLD tokens)."""
    if hi <= lo:
        return None
    on = [r for r in recs if r.rld_tokens]
    return sum(max(0.0, min(r.t_done_ns, hi) - max(r.t_send_ns, lo)) for r in on) / (hi - lo)


def with_reference(rows: list[dict], reference: str | None) -> None:
    """Into each row (in place): its BCR over the reference variant's at the same point (None without one)."""
    base = {r["point"]: r["bcr"] for r in rows if r["variant"] == reference}
    for r in rows:
        b = base.get(r["point"])
        r["bcr_over_reference"] = r["bcr"] / b if r["bcr"] is not None and b else None


def mark_cheapest(rows: list[dict], sla: float) -> dict | None:
    """The cheapest row (cost per hour, then the higher goodput) whose SLO attainment reaches sla; marked
    `cheapest: true` in place; None when no row does."""
    ok = [r for r in rows if r["slo_attainment"] is not None and r["slo_attainment"] >= sla and r["per_hour"]]
    for r in rows:
        r["cheapest"] = False
    if not ok:
        return None
    best = min(ok, key=lambda r: (r["per_hour"], -(r["goodput_rps"] or 0)))
    best["cheapest"] = True
    return best


def _num(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "–" if x is None else ("inf" if x == float("inf") else fmt.format(x))


COLUMNS: list[tuple[str, str, Callable[[dict], str]]] = [
    ("goodput rps", "goodput_rps", lambda r: _num(r["goodput_rps"], "{:,.2f}")),
    ("SLO met", "slo_attainment", lambda r: _num(r["slo_attainment"], "{:.3f}")),
    ("USD/h", "per_hour", lambda r: _num(r["per_hour"], "{:,.1f}")),
    ("BCR req/USD", "bcr", lambda r: _num(r["bcr"], "{:,.1f}")),
    ("BCR ÷ ref", "bcr_over_reference", lambda r: _num(r["bcr_over_reference"], "{:.3f}")),
    ("TTFT p50 / p90 ms", "ttft", lambda r: f"{_num(r['ttft_p50_ms'])} / {_num(r['ttft_p90_ms'])}"),
    ("RLD token share", "rld_token_share", lambda r: _num(r["rld_token_share"], "{:.3f}")),
    ("on RLD %", "on_rld", lambda r: _num(r["on_rld"], "{:.1f}")),
    ("P / MD hit %", "hits", lambda r: f"{_num(r['p_hit'], '{:.1f}')} / {_num(r['md_hit'], '{:.1f}')}"),
    (
        "RLD in flight by third of the arrivals",
        "thirds",
        lambda r: " / ".join(_num(x, "{:.1f}") for x in r.get("rld_in_flight_by_third") or [None] * 3),
    ),
    ("last third: TTFT p50 ms", "last", lambda r: _num(r["ttft_p50_last_third_ms"])),
]


def markdown(rows: list[dict], keys: list[str], reference: str | None, sla: float, head: list[str]) -> str:
    """sweep.md: one row per point and variant, the cheapest one meeting the SLA marked."""
    lines = [*head, ""]
    lines += [
        "| " + " | ".join([*keys, "variant", *(c[0] for c in COLUMNS)]) + " |",
        "|" + "---|" * (len(keys) + 1) + "---:|" * len(COLUMNS),
    ]
    for r in rows:
        name = f"**{r['variant']}** (cheapest)" if r.get("cheapest") else r["variant"]
        cells = [str(r["values"][k]) for k in keys] + [name] + [c[2](r) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    cheapest = next((r for r in rows if r.get("cheapest")), None)
    lines += [
        "",
        f"BCR: requests meeting the SLO per USD; ÷ ref: over {reference or 'no reference (no pd-intra variant)'} "
        "at the same point. Cheapest meeting the SLA (SLO met by >= "
        f"{sla:g} of requests): "
        + (
            f"{cheapest['variant']} at {cheapest['values']}, {cheapest['per_hour']:,.1f} USD/h."
            if cheapest
            else "none."
        ),
        "Published (PDD.md), pdd over same-DC homogeneous PD: BCR +37.5%, goodput +27.8%, cost 3.5-7.1% lower.",
        "",
    ]
    return "\n".join(lines)


def run(
    spec: str,
    sets: list[str],
    axes: tuple[emulated.Axis, ...],
    requests: int | None,
    seed: int | None,
    out: Path,
    sla: float = SLA_ATTAINMENT,
    say: Callable[[str], None] = print,
) -> list[dict]:
    """Every point simulated (each simulation once: points differing only in prices share it), its rows
    written to out/sweep.json and out/sweep.md; returns the rows."""
    from experiments.sim import config as sim_config, simulate
    from workers.modelled.catalogue import load_catalogue

    if not 0 < sla <= 1:
        raise SimSweepError(f"--sla {sla}: a share of requests in (0, 1]")
    base = sim_config.load_for_simulation(spec, sets)
    extra = base.spec.deployment.get("compute", {}).get("catalogue") if isinstance(base.spec.deployment, dict) else None
    catalogue = load_catalogue(*([Path(extra)] if extra else []))
    check_keys(axes, sorted(catalogue.accelerators))
    points = grid(axes)
    keys = [a.key for a in axes]
    rows: list[dict] = []
    runs: dict[tuple, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pddlab-simsweep-") as scratch:
        loads = {}
        for i, values in enumerate(points):  # every point's spec first: a bad value fails before any simulation
            k = simulated(values)
            if k not in loads:
                extra = overrides(values, str(base.spec.profile), Path(scratch), f"p{i:02d}")
                try:
                    loads[k] = sim_config.load_for_simulation(spec, [*sets, *extra])
                except (SpecError, ProfileError, sim_config.SimError) as err:
                    raise SimSweepError(f"--sweep {values}: {err}") from None
        for i, values in enumerate(points):
            k, t0 = simulated(values), time.perf_counter()
            loaded = loads[k]
            if k not in runs:
                runs[k] = simulate.simulate(loaded, requests=requests, seed=seed, analyse=False)
            sim = runs[k]
            cat = _repriced(catalogue, values)
            spec_dict = to_dict(loaded.spec)
            point_rows = []
            for v in loaded.spec.variants:
                recs = [r for r in sim.records if r.variant == v]
                per_hour = cost.variant_cost(spec_dict, v, cat).per_hour
                row = {"point": i, "values": values, "variant": v, **variant_row(recs, loaded.spec.slo, per_hour)}
                point_rows.append(row)
            ref = cost.reference(spec_dict, list(loaded.spec.variants))
            with_reference(point_rows, ref)
            rows += point_rows
            say(
                f"point {i + 1}/{len(points)} {values}: "
                + "; ".join(
                    f"{r['variant']} goodput {_num(r['goodput_rps'], '{:.2f}')} rps, BCR÷ref "
                    f"{_num(r['bcr_over_reference'], '{:.3f}')}, TTFT p50 {_num(r['ttft_p50_ms'])} ms"
                    for r in point_rows
                )
                + f" ({sim.requests} requests, {time.perf_counter() - t0:.1f} s)"
            )
    best = mark_cheapest(rows, sla)
    rate = [s.requests_per_s for s in runs.values()]
    head = [
        f"# {Path(spec).stem}: simulated sweep (SIMULATED, WAN model {next(iter(runs.values())).calibration.status})",
        "",
        f"`pddlab simulate {spec} " + " ".join(f"--set {shlex.quote(s)}" for s in sets) + " "
        f"{' '.join('--sweep ' + shlex.quote(a.key + '=' + ','.join(map(str, a.values))) for a in axes)}"
        f"{f' --requests {requests}' if requests else ''}`: {len(points)} points, {len(runs)} simulations, "
        f"{min(rate):,.0f}-{max(rate):,.0f} requests simulated per second of wall time.",
    ]
    ref = cost.reference(to_dict(base.spec), list(base.spec.variants))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.md").write_text(markdown(rows, keys, ref, sla, head))
    data = {"simulated": True, "spec": spec, "sets": sets, "axes": [dataclasses.asdict(a) for a in axes]}
    data |= {"requests": requests, "seed": seed, "sla": sla, "reference": ref, "rows": rows, "cheapest": best}
    (out / "sweep.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return rows


def _repriced(catalogue, values: dict[str, Any]):
    """The catalogue with the point's price.<accelerator> values as those devices' prices per hour."""
    prices = {k[len(PRICE) :]: float(v) for k, v in values.items() if k.startswith(PRICE)}
    if not prices:
        return catalogue
    accels = dict(catalogue.accelerators)
    for name, price in prices.items():
        accels[name] = dataclasses.replace(accels[name], price_per_hour=price)
    return dataclasses.replace(catalogue, accelerators=accels)
