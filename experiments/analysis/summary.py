"""summary.json, typed: one run's results — its one layout, writer and reader.

Responsible for: `Summary` (what the analysis of one run found: every variant's figures, the comparisons
between variants, the token streams, the reference figures, warnings) with a `schema_version`; `write` (the
one place summary.json is written) and `read` (validated: a summary of another version is an error that says
which version it has and which this code reads, and how to rewrite it: `pddlab analyze RUN`). summary.md,
sweep reports, `pddlab compare` and the plots read a run's results through these fields.
Not responsible for: computing the figures (experiments.analysis.metrics, analyze) or rendering them
(experiments.analysis.summary_md).

A per-variant figure declared with a `Column` is a column of summary.md's per-variant table on its own: adding
such a metric touches its computation and its field here, nothing else. Figures a run could not measure are
None (null in the file, "–" in summary.md), never 0. Sections not yet typed field by field (the per-path KV
transfers, each worker's figures, the ablation) are kept as mappings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict

from experiments.rundir.files import RecordError, read_record, write_json

# 1: summaries written before this module (no schema_version); 2: typed, failures ranked worst in the latency
# quantiles, WAN bytes as offered, session-clustered intervals and paired comparisons.
SCHEMA_VERSION = 2
FILE = "summary.json"


class SummaryError(RecordError):
    """summary.json is absent, of another schema version, or lacks a field; the message says which."""


@dataclass(frozen=True)
class Column:
    """A per-variant figure that is a column of summary.md's per-variant table: its heading and its digits."""

    heading: str
    digits: int = 0


class Closed(BaseModel):
    """A typed part of the summary: every field declared, nothing else accepted."""

    model_config = ConfigDict(extra="forbid")


class Stats(Closed):
    """A latency's (or other figure's) distribution over a variant's requests.

    n: values (completed requests); failed: issued requests that have no value (failed, timed out), ranked
    worst, so a percentile at or beyond the completed share is None with `beyond_completed` naming it;
    ci95: per statistic the 95% interval (None: the sample cannot support one: too few requests or sessions)
    """

    n: int
    mean: float | None = None
    std: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    failed: int = 0
    beyond_completed: list[str] = []  # the percentiles (p90, p99, ...) that land on failed requests
    ci95: dict[str, list[float | None] | None] | None = None  # an end at None: it lands on failed requests


class Comparison(Closed):
    """One variant's statistic over a baseline's: a ratio with its 95% interval and the verdict it supports.

    paired: requests matched by id across the two variants (both replayed the same workload); scope: what the
    interval covers ("this run": resampled sessions of one run; "repeats": independent runs); caveat: why the
    verdict is not called (the machinery fell behind in a variant it compares), None when it stands
    """

    metric: str
    variant: str
    baseline: str
    ratio: float | None
    ci95: list[float] | None
    verdict: str
    paired: bool = False
    scope: str = "this run"
    caveat: str | None = None


class RoleCpu(Closed):
    """One role kind's CPU time in one variant (experiments.analysis.rolecpu), summed over its workers that
    reported it (their role_cpu event); s. workers: how many reported; missing: its workers that did not (killed
    by SIGKILL: their share is not in the sums). cpu_s = user_s + system_s over the processes' lives;
    startup_cpu_s before they served, serving_cpu_s since; wall_s: their ages summed (None where one is unknown).
    Modelled compute only (None otherwise): modelled_s, the roofline's time of their passes and KV copies;
    modelled_late_s, how far past their modelled ends those ended, summed; modelled_late_max_ms, the most one did;
    pace = (modelled_s + modelled_late_s) / modelled_s, the share of the modelled speed the host kept up with"""

    workers: int
    missing: list[str] = []
    cpu_s: float | None = None
    user_s: float | None = None
    system_s: float | None = None
    startup_cpu_s: float | None = None
    serving_cpu_s: float | None = None
    wall_s: float | None = None
    modelled_s: float | None = None
    modelled_late_s: float | None = None
    modelled_late_max_ms: float | None = None

    @property
    def pace(self) -> float | None:
        """How much longer the modelled work took than the roofline (1.0: on time); None: real compute, or none."""
        if not self.modelled_s or self.modelled_late_s is None:
            return None
        return (self.modelled_s + self.modelled_late_s) / self.modelled_s


class RolesCpu(Closed):
    """The roles' CPU time in one variant: per role kind (p, rld, md, router), the totals over the kinds that
    reported, the serving CPU per completed request (s), and every worker that never reported."""

    roles: dict[str, RoleCpu]
    cpu_s: float | None = None
    serving_cpu_s: float | None = None
    serving_cpu_s_per_request: float | None = None
    missing: list[str] = []


class VariantSummary(BaseModel):
    """Every figure of one variant (experiments.analysis.metrics.variant_summary, then analyze's additions)."""

    model_config = ConfigDict(extra="forbid")

    requests: int
    issued: int
    not_issued: int
    completed: int
    failed: int
    completion_ci95: list[float] | None = None  # completed / issued, Wilson interval
    prompt_from_reference: int
    duration_s: float | None
    throughput_rps: float | None
    output_tokens_per_s: float | None
    input_tokens_total: int
    output_tokens_total: int
    total_tokens_per_s: float | None
    ttft_ms: Stats
    ttft_decode_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    decode_batch: Stats
    e2e_ms: Stats
    goodput_rps: float | None
    slo_attainment: float | None
    # WAN bytes: as offered to the WAN (the capture before the shaper, KV flows: what the headline and every
    # ratio use; None without captures), and the application's own counts beside
    wan_bytes_offered: int | None = None
    wan_bytes_total: int
    wan_bytes_per_request: Stats
    wan_kv_bytes_total: int
    wan_handoff_bytes_total: int
    fast_kv_bytes_total: int
    hit_rate: dict[str, Any]
    rld_token_share: float | None
    md_token_share: float | None
    handoff: dict[str, Any]
    singular: dict[str, Any]
    inflight: dict[str, Any]
    relay_absorbed: int
    routes: dict[str, int]
    fallbacks: dict[str, int]
    errors: list[str]
    vllm: dict[str, Any]
    # analyze's additions (absent where the run had no captures, events or emulator)
    wan_bytes_pcap: dict[str, int] | None = None
    kv_paths: dict[str, Any] | None = None
    # each WAN KV transfer's limit, rate or loss/RTT, and their counts (experiments.analysis.limits; absent
    # before it and where the line was unlimited)
    transfer_limits: dict[str, Any] | None = None
    wan_bytes: dict[str, Any] | None = None
    wan_flows: dict[str, Any] | None = None
    rld_occupancy: dict[str, Any] | None = None
    emulator: dict[str, Any] | None = None
    wan_retrans_by_impairment: dict[str, Any] | None = None
    workers: dict[str, Any] | None = None
    prefill_steps: dict[str, Any] | None = None
    # The worse direction's p99 lateness of the userspace emulator's frames in the variant's window (ms; None
    # under tc, where there is no emulator): above 1 ms the machinery is in what was measured.
    emulator_p99_late_ms: Annotated[float | None, Column("emulator p99 late ms", 1)] = None
    # the roles' CPU time (experiments.analysis.rolecpu); absent from summaries made before it and from runs whose
    # roles predate role_cpu (still version 2)
    roles_cpu: RolesCpu | None = None


# The similarity ratios (experiments.analysis.similarity computes them): name -> heading in summary.md
SIMILARITY_RATIOS = {
    "kv_transfer_over_prefill": "WAN KV transfer time ÷ prefill time",
    "rtt_over_tpot": "WAN RTT ÷ TPOT",
    "kv_bytes_over_bdp": "WAN KV bytes per request ÷ (line rate × RTT)",
    "kv_transfer_over_rld_decode": "WAN KV transfer time ÷ the RLD's decode time of the request",
    "rld_token_share": "RLD token share",
    "drc_hit": "DRC hit",
}


class Published(Closed):
    """The published deployment's value of a similarity ratio, derived from shared/PDD.md's figures.

    value: None where PDD.md does not give enough to derive it; relation: how the derived value stands to the
    deployment's ("≈", or "≥" / "≤" where a published figure only bounds a term); basis: the published figures
    used, and how"""

    value: float | None
    relation: str = "≈"
    basis: str


class SimilarityRatio(Closed):
    """One dimensionless ratio that decides PDD's behaviour, for one variant (experiments.analysis.similarity).

    statistic: what value is (a median of per-request ratios, a token share, a mean); n: the requests it is
    over; never_landed: of them, requests whose WAN copy of the prompt KV never finished (ranked as +inf);
    beyond: the median lies among those (value None); ci95: the 95% interval, sessions resampled (None: too
    few requests or sessions)"""

    ratio: str  # a key of SIMILARITY_RATIOS
    variant: str
    value: float | None
    ci95: list[float | None] | None = None
    statistic: str
    n: int
    never_landed: int = 0
    beyond: bool = False
    published: Published


class Similarity(Closed):
    """How far the run's setting is from the published deployment: the WAN profile's base round trip and line
    rate, their product, and each ratio per variant where it applies."""

    rtt_ms: float | None  # both directions' delay_ms of the WAN profile (its schedule's changes left out)
    rate_mbit: float | None  # A->B line rate; None: unlimited (or no topology)
    bdp_bytes: float | None  # rate x RTT
    ratios: list[SimilarityRatio]


class VariantCost(Closed):
    """One variant's hardware cost and BCR (experiments.analysis.cost): per_hour None under real compute.

    workers: per role it uses {role, workers, accelerator, devices, price_per_hour, cost_per_hour};
    bcr: requests meeting the SLA per USD (goodput_rps x 3600 / per_hour); over_reference: its BCR over the
    reference variant's, with the goodput comparison's interval scaled by the (exact) cost ratio"""

    mode: str
    per_hour: float | None
    workers: list[dict[str, Any]] = []
    line_per_hour: float = 0.0
    goodput_rps: float | None = None
    bcr: float | None = None
    over_reference: float | None = None
    over_reference_ci95: list[float] | None = None


class Cost(Closed):
    """Hardware cost per hour and benefit-cost ratio per variant, against a reference (same-room PD)."""

    reference: str | None
    variants: dict[str, VariantCost]
    note: str | None = None


class Summary(Closed):
    """summary.json: what the analysis of one run found."""

    schema_version: int = SCHEMA_VERSION
    variants: dict[str, VariantSummary]
    comparisons: list[Comparison]
    streams: dict[str, Any]
    reference: dict[str, Any]
    slo: dict[str, float]
    warnings: list[dict[str, Any]] = []
    complete: bool | None = None
    cross_traffic: dict[str, Any] = {}
    lines: dict[str, Any] = {}  # variant -> each line's bytes and KV transfers (experiments.analysis.lines)
    ablation: dict[str, Any] | None = None
    analysed_by: dict[str, Any] | None = None
    similarity: Similarity | None = None  # absent from summaries made before it (still version 2)
    cost: Cost | None = None  # hardware cost and BCR per variant (absent before it; still version 2)
    # EXP=pdd-published: {rows: [...]}, each published figure beside this run's (experiments/analysis/published.py);
    # absent from other runs' summaries and from those made before it (still version 2)
    published: dict[str, Any] | None = None
    # the machine's reference speed before and after the run ({start, end}: workers.speed, metadata.json's); None:
    # a run made before it was recorded (and a simulated one)
    machine: dict[str, Any] | None = None
    simulated: bool = False  # made by `pddlab simulate` (experiments/sim), not measured on the emulated WAN


def columns() -> list[tuple[str, Column]]:
    """(field, Column) of every per-variant figure that is a column of summary.md's per-variant table."""
    return [
        (name, meta)
        for name, info in VariantSummary.model_fields.items()
        for meta in info.metadata
        if isinstance(meta, Column)
    ]


def write(run_dir: Path, summary: Summary) -> None:
    """run_dir/summary.json, atomically."""
    write_json(Path(run_dir) / FILE, summary.model_dump(mode="json"))


def read(run_dir: Path) -> Summary:
    """run_dir/summary.json (or the file itself), validated; SummaryError naming the file, the version it has and
    the one this code reads (an older run: `pddlab analyze RUN` rewrites it from the run's raw files)."""
    path = Path(run_dir)
    path = path / FILE if path.is_dir() else path
    import json

    try:
        version = json.loads(path.read_text()).get("schema_version", 1)
    except FileNotFoundError:
        raise SummaryError(f"{path}: no such file (pddlab analyze {path.parent} writes it)") from None
    except (json.JSONDecodeError, AttributeError) as err:
        raise SummaryError(f"{path}: not a summary ({err})") from None
    if version != SCHEMA_VERSION:
        raise SummaryError(
            f"{path}: summary schema version {version}; this code reads version {SCHEMA_VERSION}: rewrite it with "
            f"`pddlab analyze {path.parent}` (the run's raw files are enough)"
        )
    return read_record(Summary, path, SummaryError)
