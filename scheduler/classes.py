"""Job classes derived from a profile: pure functions, ``None`` when the data is missing.

- ``kernel_class``: ``compute`` / ``memory`` / ``l1`` from stall reasons (ALGORITHMS.md §3).
- ``cm_class``: ``C`` (compute-intensive) / ``M`` (memory-intensive) from the C/M ratio (§4).
- ``scale_class``: ``small`` / ``medium`` / ``big`` from batch size x image size (§4, Table 6).
- ``sensitivity_class``: ``high`` / ``low`` from the throughput gain on a bigger resource (§4).

Every threshold is a keyword argument with the documented default, so a policy can expose it as
a parameter. Nothing here reads a clock, does I/O or imports Django.
"""

from __future__ import annotations

from typing import Literal

from scheduler.domain import Profile

KernelClass = Literal["compute", "memory", "l1"]
CmClass = Literal["C", "M"]
ScaleClass = Literal["small", "medium", "big"]
SensitivityClass = Literal["high", "low"]

#: §3: a stall reason "dominates" at S = 33 % of all stalls.
STALL_THRESHOLD_PCT = 33.0
#: §4: C/M ratio >= 10 is compute-intensive (C), below is memory-intensive (M).
CM_THRESHOLD = 10.0
#: §4 Table 6 boundaries in pixels per mini-batch (batch size x image size^2); see scale_class.
SCALE_SMALL_MAX_PIXELS = 150_000
SCALE_MEDIUM_MAX_PIXELS = 3_000_000
#: §4: sensitivity = throughput on the bigger resource / throughput on the smallest MIG instance.
SENSITIVITY_HIGH_MIN = 2.0


def kernel_class(
    profile: Profile | None,
    *,
    threshold_pct: float = STALL_THRESHOLD_PCT,
    dominant_fallback: bool = True,
) -> KernelClass | None:
    """The kernel class of ALGORITHMS.md §3 from ``profile.stall`` (percent of stalls, 0..100).

    Rule (§3, S = ``threshold_pct`` = 33 %): memory-dependency stalls >= S -> ``memory``;
    otherwise texture (L1) stalls >= S -> ``l1``; otherwise ``compute``. Memory is tested first,
    so a kernel over S on both (none in Table 7) is ``memory``.

    Gap in the paper: Table 7 labels CONV (3D convolution) ``l1`` with texture stalls of 31.64 %,
    below S. Our reading, on with ``dominant_fallback``: when neither reason reaches S, a kernel
    whose single largest stall reason is texture (or memory dependency) takes that class. This
    reproduces all 18 published classes; with ``dominant_fallback=False`` the rule is the literal
    S-threshold and CONV comes out ``compute``.

    Returns None when the profile has no stall reasons.
    """
    if profile is None or profile.stall is None:
        return None
    stall = profile.stall
    if stall.memory_dependency >= threshold_pct:
        return "memory"
    if stall.texture >= threshold_pct:
        return "l1"
    if dominant_fallback:
        reasons = {
            "exec_dependency": stall.exec_dependency,
            "instruction_fetch": stall.instruction_fetch,
            "memory_dependency": stall.memory_dependency,
            "texture": stall.texture,
            "synchronization": stall.synchronization,
            "other": stall.other,
        }
        largest = max(reasons.values())
        if largest > 0:
            top = [name for name, pct in reasons.items() if pct == largest]
            if top == ["memory_dependency"]:
                return "memory"
            if top == ["texture"]:
                return "l1"
    return "compute"


def cm_ratio(profile: Profile | None) -> float | None:
    """The C/M ratio of ALGORITHMS.md §4 (SM utilisation / memory utilisation, unitless).

    ``profile.cm_ratio`` when given; otherwise ``sm_efficiency_pct / mem_util_pct`` when both are
    known (``mem_util_pct`` 0 gives ``inf``, i.e. purely compute); otherwise None.
    """
    if profile is None:
        return None
    if profile.cm_ratio is not None:
        return profile.cm_ratio
    sm, mem = profile.sm_efficiency_pct, profile.mem_util_pct
    if sm is None or mem is None:
        return None
    if mem <= 0:
        return float("inf") if sm > 0 else None
    return sm / mem


def cm_class(profile: Profile | None, *, threshold: float = CM_THRESHOLD) -> CmClass | None:
    """``C`` if the C/M ratio (see ``cm_ratio``) is >= ``threshold`` (10, §4), else ``M``.

    None when neither ``cm_ratio`` nor both ``sm_efficiency_pct`` and ``mem_util_pct`` are known.
    """
    ratio = cm_ratio(profile)
    if ratio is None:
        return None
    return "C" if ratio >= threshold else "M"


def scale_class(
    batch_size: int | None,
    image_size: int | None,
    *,
    small_max_pixels: float = SCALE_SMALL_MAX_PIXELS,
    medium_max_pixels: float = SCALE_MEDIUM_MAX_PIXELS,
) -> ScaleClass | None:
    """The job scale of ALGORITHMS.md §4 from batch size (images) and image size (pixels a side).

    Table 6 gives examples, not boundaries: small 5x56 (8x56 in the sensitivity study), medium
    16x224, big 48x448 / 64x448 / 64x640. Our reading measures the pixels per mini-batch,
    ``batch_size * image_size**2``, which grows with both knobs the way the work per step does:
    small 15,680-25,088; medium 802,816; big 9.6 M-26 M. The boundaries sit near the geometric
    midpoints between the classes, rounded: ``small`` up to 150,000 pixels (inclusive),
    ``medium`` up to 3,000,000 (inclusive), ``big`` above.

    Returns None when either input is missing or not positive.
    """
    if batch_size is None or image_size is None or batch_size <= 0 or image_size <= 0:
        return None
    pixels = batch_size * image_size * image_size
    if pixels <= small_max_pixels:
        return "small"
    if pixels <= medium_max_pixels:
        return "medium"
    return "big"


def profile_scale_class(profile: Profile | None, **thresholds: float) -> ScaleClass | None:
    """``scale_class`` of a profile's ``batch_size`` and ``image_size`` (None if missing)."""
    if profile is None:
        return None
    return scale_class(profile.batch_size, profile.image_size, **thresholds)


def sensitivity_class(
    profile: Profile | None, *, high_min: float = SENSITIVITY_HIGH_MIN
) -> SensitivityClass | None:
    """``high`` or ``low`` resource sensitivity (ALGORITHMS.md §4).

    ``profile.sensitivity`` is read as a throughput gain (unitless, >= 1 normally): throughput
    on the bigger resource (the whole GPU) divided by throughput on the smallest MIG instance.
    A job that at least doubles its throughput (``high_min`` = 2.0) is ``high``: it uses the
    extra SMs and memory, so it should get an isolated instance sized for it (MIG) rather than
    share; a job that gains less is ``low``. The paper gives no number; 2.0 is our reading
    (a perfectly scaling job gains 4x on an A30, 7x on an A100; a flat one gains ~1x).

    Returns None when ``profile.sensitivity`` is unknown.
    """
    if profile is None or profile.sensitivity is None:
        return None
    return "high" if profile.sensitivity >= high_min else "low"
