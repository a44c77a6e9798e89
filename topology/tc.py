"""Pure builders of tc command lines for the kernel backend (`tc-netem(8)`).

Responsible for: turning one direction's `LinkParams` into the argv of a
`tc qdisc` command, and probing whether the running kernel has netem.
Not responsible for: running commands inside a host (see `topology.shaping`),
or choosing between backends.

Builders return argv lists and never touch the system, so they are unit-tested
without root. A single netem qdisc carries every parameter, rate included:
netem's own rate keeps packets in order when a rate is set, which is the
semantics the userspace backend reproduces.
"""

from __future__ import annotations

import subprocess

from topology.profiles import LinkParams


def _pct(value: float) -> str:
    return f"{value:.6g}%"


def _us(ms: float) -> str:
    return f"{round(ms * 1000)}us"


def _delay_args(p: LinkParams) -> list[str]:
    if not p.delay_ms and not p.jitter_ms:
        return []
    args = ["delay", _us(p.delay_ms)]
    if p.jitter_ms:
        args.append(_us(p.jitter_ms))
        if p.delay_correlation_pct:
            args.append(_pct(p.delay_correlation_pct))
        if p.delay_distribution != "uniform":
            args += ["distribution", p.delay_distribution]
    return args


def _loss_args(p: LinkParams) -> list[str]:
    if p.loss_ge:
        ge = p.loss_ge
        return ["loss", "gemodel", _pct(ge.p_pct), _pct(ge.r_pct), _pct(ge.bad_loss_pct), _pct(ge.good_loss_pct)]
    if not p.loss_pct:
        return []
    args = ["loss", "random", _pct(p.loss_pct)]
    if p.loss_correlation_pct:
        args.append(_pct(p.loss_correlation_pct))
    return args


def _other_args(p: LinkParams) -> list[str]:
    args: list[str] = []
    if p.duplicate_pct:
        args += ["duplicate", _pct(p.duplicate_pct)]
    if p.corrupt_pct:
        args += ["corrupt", _pct(p.corrupt_pct)]
    if p.reorder_pct:
        args += ["reorder", _pct(p.reorder_pct)]
        if p.reorder_gap:
            args += ["gap", str(p.reorder_gap)]
    if p.rate_mbit:
        args += ["rate", f"{round(p.rate_mbit * 1e6)}bit"]
    return args


def netem_args(p: LinkParams) -> list[str]:
    """The `netem ...` part of a qdisc command for one direction."""
    return ["netem", "limit", str(p.effective_limit_pkts), *_delay_args(p), *_loss_args(p), *_other_args(p)]


def netem_cmd(dev: str, p: LinkParams, verb: str = "replace") -> list[str]:
    """argv that installs (`replace`) or live-changes (`change`) netem as the root qdisc of dev."""
    if verb not in ("replace", "change", "add"):
        raise ValueError(f"verb must be replace, change or add, got {verb!r}")
    return ["tc", "qdisc", verb, "dev", dev, "root", *netem_args(p)]


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
