"""Pure builders of tc command lines for the kernel backend (`tc-netem(8)`).

Responsible for: turning one direction's `LinkParams` into the argv of a
`tc qdisc` command, and probing whether the running kernel has netem.
Not responsible for: running commands inside a host (see `topology.shaping`),
or choosing between backends.

The netem arguments come from topology.netem_grammar's renderer, the one home of
netem's syntax. Builders return argv lists and never touch the system, so they are unit-tested
without root. A single netem qdisc carries every parameter, rate included:
netem's own rate keeps packets in order when a rate is set, which is the
semantics the userspace backend reproduces.

from __future__ import annotations

A user's distribution table (a .dist file path in LinkParams) is named to tc as iproute2 finds tables:
`distribution STEM` with TC_LIB_DIR set to the file's folder (the argv starts with `env TC_LIB_DIR=...`);
otherwise the argv carries LinkParams.netem_line() word for word, but for one zero that tc needs to pass on a
duplicate correlation (netem_args). A rate trace (LinkParams.rate_trace) is
not netem's: the line carries no rate, and topology.shaping changes the rate per window
(topology.rate_trace.rate_schedule).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from topology.netem_grammar import render_netem
from topology.netem_options import is_table_file
from topology.profiles import LinkParams


def _table_dir(p: LinkParams) -> Path | None:
    """The one folder tc must read the user's tables from (delay's and slot's), None when only shipped ones."""
    names = [p.delay_distribution, *([p.slot.distribution] if p.slot and p.slot.distribution else [])]
    dirs = {Path(n).resolve().parent for n in names if is_table_file(n)}
    shipped = [n for n in names if n != "uniform" and not is_table_file(n)]
    if len(dirs) > 1 or (dirs and shipped):
        raise ValueError(f"tc reads every table from one TC_LIB_DIR: put {', '.join(names)} (.dist) in one folder")
    return dirs.pop() if dirs else None


def _sends_correlations(p: LinkParams) -> bool:
    """Whether iproute2's tc sends netem's correlation attribute (TCA_NETEM_CORR) for p's line.

    tc sends it only when the line gives a correlation to delay, random loss, reorder or corrupt: `duplicate P C`
    parses C into the attribute but does not mark it present (tc/q_netem.c, from the first release to today's), so
    `netem duplicate 50% 90%` alone reaches the kernel uncorrelated and `tc qdisc show` prints `duplicate 50%`.
    Seen on Debian's 6.1 kernel (docs/real-kernel.md): runs of doubled packets 2.02 long, what no correlation gives.
    """
    return bool(
        (p.jitter_ms and p.delay_correlation_pct)
        or (_random_loss(p) and p.loss_correlation_pct)
        or (p.reorder_pct and p.reorder_correlation_pct)
        or (p.corrupt_pct and p.corrupt_correlation_pct)
    )


def _with_correlations_sent(args: list[str], p: LinkParams) -> list[str]:
    """args with a zero delay correlation added, which makes tc send netem's correlations (see _sends_correlations).

    The zero (`delay D 0us 0%`, or `0%` after the jitter: no delay correlation either way) changes nothing in the
    kernel's model; it only carries the attribute, with the duplicate's correlation in it.
    `tc qdisc show` then prints the line as LinkParams.netem_line() does (a zero jitter and a zero correlation
    are not printed).
    """
    if _sends_correlations(p):
        return args
    if "delay" not in args:
        at = 2 if args[:1] == ["limit"] else 0
        return [*args[:at], "delay", "0us", "0us", "0%", *args[at:]]
    at = args.index("delay") + 2  # past the delay; a jitter here has no correlation, or one would be sent already
    if p.jitter_ms:
        return [*args[: at + 1], "0%", *args[at + 1 :]]
    return [*args[:at], "0us", "0%", *args[at:]]


def netem_args(p: LinkParams) -> list[str]:
    """The `netem ...` part of a qdisc command for one direction: the line LinkParams.netem_line() shows (a user's
    table by its stem, see the module docstring), with a zero delay correlation where tc needs it to pass on the
    duplicate's (_with_correlations_sent). A change sends the line alone: the kernel keeps what it leaves out
    (stale_after_change: TcBackend reinstalls netem where that would be in use)."""
    args = render_netem(p, p.effective_limit_pkts)
    if p.duplicate_pct and p.duplicate_correlation_pct:
        args = _with_correlations_sent(args, p)
    return ["netem", *(Path(a).name.removesuffix(".dist") if is_table_file(a) else a for a in args)]


def _random_loss(p: LinkParams) -> bool:
    return bool(p.loss_pct) and not p.loss_state and not p.loss_ge


def _sends_any_correlation(p: LinkParams) -> bool:
    """Whether p's argv (netem_args) makes tc send netem's correlation attribute."""
    return _sends_correlations(p) or bool(p.duplicate_pct and p.duplicate_correlation_pct)


def kept_by(p: LinkParams) -> frozenset[str]:
    """What installing or changing to p leaves in the kernel's netem that a later change keeps unless it names it
    again (the kernel's netem_change): "delay table", "slot table" (a shipped or a user's distribution), "corrupt",
    "rate", "slot", "correlations" (non-zero delay, loss or duplicate correlations)."""
    kept = {
        "delay table": bool(p.jitter_ms) and p.delay_distribution != "uniform",
        "slot table": p.slot is not None and bool(p.slot.distribution),
        "corrupt": bool(p.corrupt_pct),
        "rate": bool(p.rate_mbit or p.rate_trace),
        "slot": p.slot is not None,
        "correlations": _sends_any_correlation(p)
        and bool(
            (p.jitter_ms and p.delay_correlation_pct)
            or (_random_loss(p) and p.loss_correlation_pct)
            or (p.duplicate_pct and p.duplicate_correlation_pct)
        ),
    }
    return frozenset(name for name, held in kept.items() if held)


def kept_after(kept: frozenset[str], p: LinkParams) -> frozenset[str]:
    """What the kernel holds after a change to p from a netem holding kept: what p sends replaces (correlations
    are sent whole, zeros included), the rest stays."""
    now = kept_by(p)
    sent = now | ({"correlations"} if _sends_any_correlation(p) else set())
    return (kept - sent) | now


def stale_after_change(kept: frozenset[str], p: LinkParams) -> tuple[str, ...]:
    """What of kept (see kept_by) a `tc qdisc change` to p would leave in use though p does not say it.

    The kernel replaces each of these only when the message carries it, and tc carries it only where the line
    names it: `change ... delay 30ms` after `... corrupt 5% rate 100mbit` goes on corrupting at 100 Mbit/s, a
    uniform jitter after a pareto one draws from pareto's table, a line without correlations after one with
    draws correlated. A table cannot be dropped by a change at all, so TcBackend reinstalls netem where this is
    not empty (a change keeps queued packets; a reinstall loses them, which only these changes pay). A kept
    reorder is harmless: every message sets netem's gap, and a gap of 0 (a line without reorder) turns
    reordering off. Something kept but unused (a table without a jitter, correlations without a jitter, random
    loss or duplicates) is not stale.
    """
    uses = {
        "delay table": bool(p.jitter_ms) and p.delay_distribution == "uniform",
        "slot table": p.slot is not None and not p.slot.distribution,
        "corrupt": not p.corrupt_pct,
        "rate": not (p.rate_mbit or p.rate_trace),
        "slot": p.slot is None,
        "correlations": not _sends_any_correlation(p) and bool(p.jitter_ms or _random_loss(p) or p.duplicate_pct),
    }
    return tuple(name for name in sorted(kept) if uses[name])


def netem_cmd(dev: str, p: LinkParams, verb: str = "replace") -> list[str]:
    """argv that installs (`replace`) or live-changes (`change`) netem as the root qdisc of dev."""
    if verb not in ("replace", "change", "add"):
        raise ValueError(f"verb must be replace, change or add, got {verb!r}")
    table_dir = _table_dir(p)
    env = ["env", f"TC_LIB_DIR={table_dir}"] if table_dir else []
    return [*env, "tc", "qdisc", verb, "dev", dev, "root", *netem_args(p)]


def delete_root_cmd(dev: str) -> list[str]:
    """argv that removes dev's root qdisc (restoring the default)."""
    return ["tc", "qdisc", "del", "dev", dev, "root"]


def offload_off_cmd(dev: str) -> list[str]:
    """argv that turns off segmentation and checksum offloads, so each frame is shaped as on a wire.

    With them on, a 64 KB GSO frame would be shaped (and lost) as one packet, and
    veth would mark frames CHECKSUM_UNNECESSARY so a corrupted one would be accepted.
    """
    return ["ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", "tx", "off", "rx", "off"]


def kernel_has_netem() -> bool:
    """True when this kernel accepts a netem qdisc (asked on a throwaway namespace's loopback)."""
    probe = ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    return subprocess.run(probe, capture_output=True).returncode == 0
