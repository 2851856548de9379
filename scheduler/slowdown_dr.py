"""The data-ratio (DR) manager of ``slowdown_dr`` (paper 000, Algorithm 1; ALGORITHMS.md §5).

Every data-parallel job splits each mini-batch over the GPUs of its node by its **data ratio**:
one integer per GPU, 0..10, summing to 10 (tenths of the batch). At each epoch end a job
publishes its Slow-Down SD_i, and the manager answers with its ratio for the next epoch:

1. **Consolidate** (running jobs <= GPUs): the job gets 10/10 on the least-utilised GPU that no
   other job is given. *Reading*: the paper removes each GPU it hands out from the set; here a
   GPU counts as given when another job has a share on it, so candidates are ordered by the
   other jobs' shares on them (0 first), then utilisation, then index. A job already alone on
   one GPU keeps it.
2. **Keep** the ratio when SD_i is not the largest SD of the set or SD_max_diff < ``SD_th``.
3. **Utilisation branch**: GPU_max = the most utilised GPU the job uses, GPU_min = the least
   utilised GPU of the node. If util(GPU_max) - util(GPU_min) > ``Util_th``, the job's GPUs
   plus GPU_min share the batch in proportion to their remaining capacity (100 - util):
   ``DR_Update_Util``.
4. **Slow-Down branch** otherwise: GPU_dest = the GPU whose jobs have the smallest mean SD (a
   GPU nobody uses counts 0: nothing is slowed there), GPU_src = the GPU of the job's largest
   share; ``E_mbr = (SD_i - 1) / DR[src]`` and ``r = (SD_i - (max SD + min SD) / 2) / E_mbr``
   tenths move from src to dest: ``DR_Update_SD``.

Gaps of the paper closed here (written into docs/slowdown.md too):

- Rounding keeps the sum at exactly 10: ``largest_remainder`` (floors, then the largest
  fractional parts get the missing tenths; ties to the lower GPU index).
- r is an integer: rounded half up, then clamped to 0..DR[src]. SD_i <= 1 (the job is not
  slowed) moves nothing, as E_mbr would be <= 0.
- When GPU_dest would be GPU_src (the job's main GPU is the least slowed one), the next GPU by
  mean SD is used.
- Utilisations are percent 0..100; an unknown one counts as 0 (idle).

Pure functions over plain values: the policy (``scheduler.policies.slowdown_dr``), the
data-parallel simulator and the live loop call the same code. Every answer says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Tenths: a data ratio always sums to this.
RATIO_TOTAL = 10


class RatioError(ValueError):
    """A data ratio that is not integers 0..10 summing to 10."""


@dataclass(frozen=True, slots=True)
class DrJob:
    """One job in the manager's table: its current ratio (per GPU index) and last SD."""

    job_id: str
    ratio: tuple[int, ...]
    slowdown: float | None
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class DrParams:
    """Thresholds of Algorithm 1 (policy parameters of ``slowdown_dr``).

    ``sd_threshold``: SD_th, unitless; below this SD_max_diff nothing moves.
    ``util_threshold_pct``: Util_th, percentage points; a larger utilisation gap between the
    job's busiest GPU and the least utilised one selects the utilisation branch.
    The paper gives no values; the defaults are readings (docs/slowdown.md): SD_th 0.1 is the
    paper's own target gap in set (a); Util_th 50 because in synchronous data parallelism a GPU
    waiting on its job's other GPUs shows gaps of up to about 40 points that are not free
    capacity (below that, the utilisation branch chases the job's own barrier waits).
    """

    sd_threshold: float = 0.1
    util_threshold_pct: float = 50.0


@dataclass(frozen=True, slots=True)
class DrChange:
    """The manager's answer for one job. ``branch``: consolidate, keep, util or slowdown."""

    job_id: str
    old: tuple[int, ...]
    new: tuple[int, ...]
    branch: str
    explanation: str

    @property
    def changed(self) -> bool:
        return self.new != self.old


def check_ratio(ratio: Sequence[int], gpus: int | None = None) -> tuple[int, ...]:
    """``ratio`` as a tuple if it is integers 0..10 summing to 10 (and ``gpus`` long)."""
    out = tuple(ratio)
    if gpus is not None and len(out) != gpus:
        raise RatioError(f"a data ratio needs one entry per GPU ({gpus}), got {len(out)}")
    if not out or any(isinstance(v, bool) or not isinstance(v, int) for v in out):
        raise RatioError(f"a data ratio is a list of integers, got {list(ratio)!r}")
    if any(v < 0 or v > RATIO_TOTAL for v in out):
        raise RatioError(f"each data ratio entry is 0..{RATIO_TOTAL}, got {list(out)}")
    if sum(out) != RATIO_TOTAL:
        raise RatioError(f"a data ratio sums to {RATIO_TOTAL}, got {sum(out)} ({list(out)})")
    return out


def single_ratio(gpu: int, gpus: int) -> tuple[int, ...]:
    """10/10 on GPU ``gpu`` of ``gpus``."""
    return tuple(RATIO_TOTAL if g == gpu else 0 for g in range(gpus))


def largest_remainder(weights: Sequence[float], total: int = RATIO_TOTAL) -> tuple[int, ...]:
    """Integers proportional to ``weights`` summing to exactly ``total`` (Hamilton's method).

    Negative weights count 0; all-zero weights give everything to the first entry.
    """
    w = [max(0.0, float(x)) for x in weights]
    s = sum(w)
    if not w:
        raise RatioError("no weights")
    if s <= 0:
        return tuple(total if i == 0 else 0 for i in range(len(w)))
    exact = [x / s * total for x in w]
    floors = [math.floor(x) for x in exact]
    missing = total - sum(floors)
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in order[:missing]:
        floors[i] += 1
    return tuple(floors)


def split_by_ratio(total: int, ratio: Sequence[int]) -> tuple[int, ...]:
    """Split ``total`` items by ``ratio``; the parts always add up to ``total`` exactly."""
    if total < 0:
        raise ValueError(f"cannot split a negative total ({total})")
    return largest_remainder(ratio, total) if any(r > 0 for r in ratio) else (total,)


def _util(util: Sequence[float | None], g: int) -> float:
    v = util[g] if g < len(util) else None
    return 0.0 if v is None else float(v)


def dr_update_util(
    ratio: Sequence[int], util: Sequence[float | None], gpu_min: int
) -> tuple[int, ...]:
    """``DR_Update_Util``: the job's GPUs plus ``gpu_min`` by remaining capacity (100 - util)."""
    used = {g for g, r in enumerate(ratio) if r > 0} | {gpu_min}
    weights = [max(0.0, 100.0 - _util(util, g)) if g in used else 0.0 for g in range(len(ratio))]
    if sum(weights) <= 0:
        return tuple(ratio)
    return largest_remainder(weights)


def dr_update_sd(
    sd_i: float, ratio: Sequence[int], sd_set: Sequence[float], src: int, dest: int
) -> tuple[tuple[int, ...], int]:
    """``DR_Update_SD``: (new ratio, r) with r tenths moved from ``src`` to ``dest``."""
    cur = list(ratio)
    if cur[src] <= 0 or sd_i <= 1.0 or src == dest:
        return tuple(cur), 0
    e_mbr = (sd_i - 1.0) / cur[src]
    target = (max(sd_set) + min(sd_set)) / 2.0
    r = math.floor((sd_i - target) / e_mbr + 0.5)
    r = max(0, min(cur[src], r))
    cur[src] -= r
    cur[dest] += r
    return tuple(cur), r


def _gpu_mean_sd(jobs: Mapping[str, DrJob], gpus: int) -> list[float]:
    out = []
    for g in range(gpus):
        sds = [
            j.slowdown
            for j in jobs.values()
            if j.slowdown is not None and g < len(j.ratio) and j.ratio[g] > 0
        ]
        out.append(sum(sds) / len(sds) if sds else 0.0)
    return out


def _fmt(ratio: Sequence[int]) -> str:
    return "[" + ", ".join(str(v) for v in ratio) + "]"


def manage(
    job_id: str,
    jobs: Mapping[str, DrJob],
    util: Sequence[float | None],
    params: DrParams | None = None,
) -> DrChange:
    """Algorithm 1 for job ``job_id`` of ``jobs`` (every running job of the node, by id) on a
    node whose GPU ``g`` is ``util[g]`` percent utilised. See the module docstring."""
    p = params or DrParams()
    me = jobs[job_id]
    old = check_ratio(me.ratio)
    gpus = len(old)
    label = f"job {job_id}"

    def keep(why: str, branch: str = "keep") -> DrChange:
        return DrChange(job_id, old, old, branch, f"kept {label}'s data ratio {_fmt(old)}: {why}")

    if len(jobs) <= gpus:
        others = [0] * gpus
        for j in jobs.values():
            if j.job_id != job_id:
                for g in range(min(gpus, len(j.ratio))):
                    others[g] += j.ratio[g]
        best = min(range(gpus), key=lambda g: (others[g], _util(util, g), g))
        mine = [g for g, r in enumerate(old) if r > 0]
        if len(mine) == 1 and others[mine[0]] == 0:
            return keep(f"{len(jobs)} jobs on {gpus} GPUs and it has GPU {mine[0]} alone")
        new = single_ratio(best, gpus)
        why = (
            f"{len(jobs)} jobs on {gpus} GPUs: GPU {best} is the least used by others "
            f"(their share {others[best]}/10, utilisation {_util(util, best):.0f}%)"
        )
        if new == old:
            return keep(why, "consolidate")
        return DrChange(job_id, old, new, "consolidate", f"gave {label} 10/10 on GPU {best}: {why}")

    sds = {k: j.slowdown for k, j in jobs.items() if j.slowdown is not None}
    if me.slowdown is None or not sds:
        return keep("its Slow-Down is not known yet")
    sd_i = me.slowdown
    hi, lo = max(sds.values()), min(sds.values())
    diff = hi - lo
    if sd_i < hi:
        return keep(f"SD {sd_i:.2f} is not the largest ({hi:.2f})")
    if diff < p.sd_threshold:
        return keep(f"SD_max_diff {diff:.2f} < SD_th {p.sd_threshold:g}")
    used = [g for g, r in enumerate(old) if r > 0]
    gpu_max = max(used, key=lambda g: (_util(util, g), -g))
    gpu_min = min(range(gpus), key=lambda g: (_util(util, g), g))
    gap = _util(util, gpu_max) - _util(util, gpu_min)
    if gap > p.util_threshold_pct:
        new = dr_update_util(old, util, gpu_min)
        why = (
            f"SD {sd_i:.2f} is the largest (SD_max_diff {diff:.2f}); GPU {gpu_max} at "
            f"{_util(util, gpu_max):.0f}% vs GPU {gpu_min} at {_util(util, gpu_min):.0f}% "
            f"(gap {gap:.0f} > Util_th {p.util_threshold_pct:g}): split by remaining capacity"
        )
        if new == old:
            return keep(why, "util")
        return DrChange(
            job_id, old, new, "util", f"moved {label}'s batch {_fmt(old)} -> {_fmt(new)}: {why}"
        )
    mean_sd = _gpu_mean_sd(jobs, gpus)
    src = max(range(gpus), key=lambda g: (old[g], -g))
    by_sd = sorted(range(gpus), key=lambda g: (mean_sd[g], _util(util, g), g))
    dest = by_sd[0] if by_sd[0] != src else by_sd[1] if gpus > 1 else src
    new, r = dr_update_sd(sd_i, old, list(sds.values()), src, dest)
    target = (hi + lo) / 2.0
    if r == 0:
        return keep(f"SD {sd_i:.2f} vs target {target:.2f}: less than 1/10 to move", "slowdown")
    return DrChange(
        job_id,
        old,
        new,
        "slowdown",
        f"moved {r}/10 of {label}'s batch from GPU {src} to GPU {dest}: SD {sd_i:.2f} vs "
        f"target {target:.2f} (set max {hi:.2f}, min {lo:.2f}); GPU {dest}'s jobs average SD "
        f"{mean_sd[dest]:.2f}; utilisation gap {gap:.0f} <= Util_th {p.util_threshold_pct:g}",
    )
