"""Estimated solo times on a GPU model nobody measured, from a time measured on another one.

The seeds measured their applications on a Titan Xp; a cluster with other GPUs (the demo's A30s)
needs times there too, or policies that only trust profiled models leave those GPUs idle. Where
no measurement exists, ``estimate_gpu_time`` scales the measured time by the ratio of the two
models' catalogue figures (``scheduler.catalog``), chosen by what bounds the application:

- ``memory`` (memory-dependency stalls dominate, ALGORITHMS.md §3): DRAM bandwidth ratio;
- ``compute``: peak FP32 GFLOPS ratio;
- anything else (``l1``, or no kernel class known): the geometric mean of the two ratios.

Titan Xp -> A30 this gives 1.70x (memory-bound), 0.85x (compute-bound: the A30's FP32 peak is
lower) and 1.20x (unknown). It is a first-order roofline estimate, not a measurement: it ignores
caches, clocks, tensor cores and the host. Profiles that use it say so in their sources, and a
measured time always wins (replace it in the profile when you have one).
"""

from __future__ import annotations

import math

from scheduler.catalog import gpu_spec

#: How a profile's sources describe an estimated time.
METHOD = (
    "estimated from the {base} time: {how} ratio of the catalogue figures (scheduler.gpu_estimates)"
)


def speed_ratio(base_model: str, target_model: str, kernel_class: str | None = None) -> float:
    """How many times faster ``target_model`` runs an application than ``base_model`` does
    (> 1: faster), by the rule of the module docstring."""
    base, target = gpu_spec(base_model), gpu_spec(target_model)
    bandwidth = target.dram_bw_gbps / base.dram_bw_gbps
    compute = target.peak_gflops / base.peak_gflops
    if kernel_class == "memory":
        return bandwidth
    if kernel_class == "compute":
        return compute
    return math.sqrt(bandwidth * compute)


def estimate_gpu_time(
    time_s: float, base_model: str, target_model: str, kernel_class: str | None = None
) -> tuple[float, str]:
    """The estimated solo time on ``target_model`` of an application measured at ``time_s``
    seconds on ``base_model``, and a sentence saying how it was estimated."""
    ratio = speed_ratio(base_model, target_model, kernel_class)
    how = {"memory": "DRAM bandwidth", "compute": "FP32 GFLOPS"}.get(
        kernel_class or "", "geometric mean of the bandwidth and GFLOPS"
    )
    note = METHOD.format(base=gpu_spec(base_model).model, how=how) + f", x{ratio:.2f} faster"
    return float(f"{time_s / ratio:.3g}"), note  # three significant digits
