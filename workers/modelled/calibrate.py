"""Calibrating a roofline: the efficiency factors that make its step times match measured ones.

Responsible for: `fit_efficiency`, which takes measured steps (the parts of each step and its wall time) and
finds the compute and memory efficiencies, the compute ramp and the fixed per-step and per-request overheads
that minimise the squared log
error of the roofline's predictions (scipy's bounded least squares); `relative_error`.
Not responsible for: measuring (benchmarks/bench_roofline.py runs the real engine) or the roofline itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from workers.modelled.catalogue import Accelerator, Efficiency, ModelArch
from workers.modelled.roofline import Part, Roofline

MAX_RAMP_TOKENS = 4096.0  # a step needing more tokens than this to reach half its peak would mean the same
MAX_OVERHEAD_S = 0.1  # a per-step overhead above 100 ms would mean the roofline explains nothing


@dataclass(frozen=True)
class Measured:
    """One measured step: its parts and its wall time (s); label names it in a report."""

    label: str
    parts: tuple[Part, ...]
    seconds: float


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured."""
    return (predicted - measured) / measured


def fit_efficiency(
    accelerator: Accelerator, model: ModelArch, points: Sequence[Measured], devices: int = 1
) -> Efficiency:
    """The efficiency (compute, memory, step and part overheads, ramp tokens; host_link kept) whose roofline
    best predicts points, in the least-squares sense of log(predicted / measured). Needs at least one point."""
    if not points:
        raise ValueError("fit_efficiency needs at least one measured point")
    base = accelerator.efficiency

    def efficiency(x: np.ndarray) -> Efficiency:
        return dataclasses.replace(
            base,
            compute=float(x[0]),
            memory=float(x[1]),
            step_overhead_s=float(x[2]),
            part_overhead_s=float(x[3]),
            ramp_tokens=float(x[4]),
        )

    def residuals(x: np.ndarray) -> np.ndarray:
        roof = Roofline(accelerator, model, devices, efficiency(x))
        return np.array([math.log(roof.step(p.parts).seconds / p.seconds) for p in points])

    overheads = [min(base.step_overhead_s, MAX_OVERHEAD_S / 2), min(base.part_overhead_s, MAX_OVERHEAD_S / 2)]
    x0 = np.array([base.compute, base.memory, *overheads, min(base.ramp_tokens, MAX_RAMP_TOKENS / 2)])
    hi = [1.0, 1.0, MAX_OVERHEAD_S, MAX_OVERHEAD_S, MAX_RAMP_TOKENS]
    fit = least_squares(residuals, x0, bounds=([0.001, 0.001, 0.0, 0.0, 0.0], hi), x_scale="jac")
    return efficiency(fit.x)
