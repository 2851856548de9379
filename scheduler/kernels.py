"""Kernel-level co-run model of K-Scheduler's scenario (thesis 003, chapter IV; ALGORITHMS §3).

The 18 benchmark kernels of Table 7 on the thesis' Titan Xp (30 SMs), as ``Profile`` objects
the policies read, and the model the simulator uses to run them together on one GPU. Every
constant says where it comes from; docs/sharing.md has the long version and the check against
the thesis' own pair measurements (``PAIR_OBSERVATIONS``).

**Per kernel** (Table 7 and the text): stall reasons, eligible warps per cycle (EPC), class,
registers and shared memory per thread block. The thesis gives solo times and saturation
points for four kernels only (LavaMD, SPMV, STENCIL, CUTCP, figures 15 and 18); for the other
fourteen:

- the *knee* (thread blocks per SM beyond which the kernel gains nothing, its saturation point
  at 30 SMs) follows Observation #1 ("low EPC saturates early"): ``knee = a + b ln EPC``,
  least-squares fitted to the four observed points (LM 0.17 -> 2, SPMV 0.72 -> 4, CUTCP 5.67 ->
  10, STENCIL 5.68 -> 12; a = 6.08, b = 2.70), rounded, at least 1 and at most what the
  kernel's registers and shared memory allow per SM;
- the shape below the knee: ``perf(j) = (min(j, knee) / knee) ** beta`` with
  ``beta = 0.81 EPC / (EPC + 0.82)``, solved from LavaMD (1 TB: 64 ms vs 58 ms at 2 TBs, beta
  0.14) and CUTCP (1 TB: 237 ms vs 46 ms at 10, beta 0.71): a low-EPC kernel barely cares how
  many blocks it gets, a high-EPC one scales almost linearly;
- solo time (ms at the knee): ASSUMED (``SOLO_MS``), 40-150 ms, except the four measured;
- DRAM bandwidth demand (GB/s at full speed): BlackScholes 266 (the text); Hotspot3D, RD, NW,
  SPMV, SY and STENCIL from Table 8's pair sums (solved: HS 360, RD 17, NW 81, SPMV 350; SY
  and STENCIL split 391 by their memory stalls); the rest ``360 x memory-dependency share``
  (BlackScholes' ratio);
- compute demand: LavaMD 200.26 GFLOPS (double precision, against the Titan Xp's 379.7); none
  for the others (single-precision demand is far below 12.15 TFLOPS);
- L1 transactions: not in the thesis; ASSUMED proxy ``texture% + memory-dependency% / 2``
  (QuasiRandom, which the thesis singles out as L1-free, gets 0.4).

**Co-run model** (``corun_speeds``): kernels share every SM (intra-SM sharing). Kernel ``i``
gets the thread blocks per SM its share of the SM's resources allows (``tbs_for_share``:
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` read as a share of registers, shared memory and block
slots); if the group's blocks do not fit an SM together they are scaled down in proportion.
Its speed relative to solo is ``perf_i(j_i) / stretch_i`` where ``stretch_i`` stretches each
part of its time (split by its stall reasons) by the contention on that resource:

- issue part (everything but memory and texture stalls) by ``max(1, sum_k issue_k)`` with
  ``issue_k = min(1, EPC_k) perf_k``: a scheduler issues one warp a cycle, a kernel with
  EPC >= 1 already fills it (Observation #5), low-EPC kernels leave slots to others;
  a kernel with a GFLOPS demand also by ``max(1, sum GFLOPS / supply)`` (Observation #2);
- memory part by ``max(1, sum DRAM demand / 547.6 GB/s)`` (Observation #2) times
  ``1 + KAPPA sum_{k != i} mem_k perf_k``: contention in caches and memory queues that shows
  even below the bandwidth limit (Observation #4);
- texture part by ``1 + LAMBDA sum_{k != i} l1_k perf_k / 100`` (Observation #3).

KAPPA and LAMBDA are fitted to the thesis' pair measurements (``PAIR_OBSERVATIONS``; each
kernel at its saturation share; docs/sharing.md shows model vs thesis for each): LM+SPMV 1.8,
SPMV+QS 1.3, SPMV+BS 0.77, LBM+LBM 0.55, LBM+QS 1.11, NW+HW 1.03, HW+RD 0.91. The workloads
W1-W9 are not used in the fit.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from scheduler.classes import kernel_class
from scheduler.domain import JobKind, Profile, StallReasons

TABLE7_CSV = Path(__file__).resolve().parent / "data" / "seeds" / "003_kernels_table7.csv"
GPU_MODEL = "TitanXp"


@dataclass(frozen=True, slots=True)
class SmLimits:
    """Per-SM limits and system supply of the thesis' Titan Xp (ALGORITHMS §3)."""

    sms: int = 30
    max_regs: int = 65536
    max_smem_bytes: int = 96 * 1024
    max_tbs: int = 32
    dram_bw_gbps: float = 547.6
    gflops: float = 379.7  # double precision: the one kernel with a compute demand is DP


TITAN_XP = SmLimits()

#: Solo time (ms) at the kernel's knee. Measured in the thesis: LM, SPMV, STENCIL, CUTCP (at
#: their saturation points, figures 15 and 18); the others ASSUMED.
SOLO_MS: Mapping[str, float] = {
    "LM": 58.0,
    "SPMV": 68.0,
    "STENCIL": 59.0,
    "CUTCP": 46.0,
    "BS": 80.0,
    "LBM": 105.0,
    "FT": 120.0,
    "QS": 40.0,
    "NW": 90.0,
    "HW": 110.0,
    "DX": 60.0,
    "BO": 100.0,
    "CP": 75.0,
    "SG": 130.0,
    "RD": 45.0,
    "COV": 150.0,
    "SY": 140.0,
    "CONV": 95.0,
}
#: Saturation points the thesis observed (thread blocks per SM at 30 SMs).
OBSERVED_KNEE: Mapping[str, int] = {"LM": 2, "SPMV": 4, "CUTCP": 10, "STENCIL": 12}
KNEE_A, KNEE_B = 6.08, 2.70  # knee = a + b ln EPC, fitted to OBSERVED_KNEE
BETA_MAX, BETA_HALF = 0.81, 0.82  # beta = BETA_MAX EPC / (EPC + BETA_HALF)
#: DRAM demand (GB/s at solo speed) where the thesis gives it or Table 8 implies it.
DRAM_GBPS: Mapping[str, float] = {
    "BS": 266.0,
    "HW": 360.5,
    "RD": 16.5,
    "NW": 80.5,
    "SPMV": 349.5,
    "SY": 214.0,
    "STENCIL": 177.0,
}
DRAM_PER_MEMORY_SHARE = 360.0  # GB/s per unit of memory-dependency share (BlackScholes' ratio)
GFLOPS: Mapping[str, float] = {"LM": 200.26}
# Contention constants, least-squares fitted (log of the pair speedup) to PAIR_OBSERVATIONS
# on a 0.1 / 0.5 grid: rms error 5 % over the seven pairs (``fit_contention`` redoes it).
KAPPA = 2.7  # memory-system contention per unit of a co-runner's memory share
LAMBDA = 10.0  # texture contention per unit (percent / 100) of a co-runner's L1 proxy

#: The thesis' pair measurements (chapter IV §2): sequential time / co-run time of the pair.
PAIR_OBSERVATIONS: Mapping[tuple[str, str], float] = {
    ("LM", "SPMV"): 1.8,
    ("SPMV", "QS"): 1.3,
    ("SPMV", "BS"): 0.77,
    ("LBM", "LBM"): 0.55,
    ("LBM", "QS"): 1.11,
    ("NW", "HW"): 1.03,
    ("HW", "RD"): 0.91,
}

#: Workloads W1-W9 (thesis Table 9 gives their character only; the kernels are ASSUMED):
#: six kernels each, taken in Table 7 order from the classes the character names.
WORKLOADS: Mapping[str, tuple[str, ...]] = {
    "W1": ("LM", "CUTCP", "FT", "QS", "DX", "BO"),  # compute
    "W2": ("BS", "STENCIL", "SPMV", "NW", "HW", "RD"),  # memory
    "W3": ("LM", "CUTCP", "FT", "BS", "STENCIL", "SPMV"),  # C + M 1:1
    "W4": ("LM", "CUTCP", "FT", "QS", "BS", "STENCIL"),  # C + M 2:1
    "W5": ("BS", "CUTCP", "STENCIL", "QS", "HW", "DX"),  # EPC > 1
    "W6": ("LM", "SPMV", "LBM", "FT", "NW", "RD"),  # EPC < 1
    "W7": ("BS", "CUTCP", "STENCIL", "LM", "SPMV", "LBM"),  # EPC > 1 : < 1 = 1:1
    "W8": ("BS", "CUTCP", "LM", "SPMV", "LBM", "FT"),  # 1:2
    "W9": ("BS", "CUTCP", "STENCIL", "QS", "LM", "SPMV"),  # 2:1
}
#: What the thesis reports over W1-W9 (weighted speedup, ANTT, fairness).
THESIS_RESULTS: Mapping[str, tuple[float, float, float]] = {
    "kscheduler": (1.31, 1.31, 0.47),
    "warped_slicer": (1.15, 2.22, 0.30),
    "even_partition": (1.08, 2.56, 0.27),
}


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One row of Table 7."""

    app: str
    name: str
    stall: StallReasons
    epc: float
    kind: str
    registers_per_block: int
    smem_per_block_bytes: int


@lru_cache(maxsize=1)
def table7() -> dict[str, KernelRow]:
    """Table 7 of the thesis as rows keyed by the short name (``LM``, ``BS``, ...)."""
    out = {}
    with open(TABLE7_CSV, newline="") as f:
        for row in csv.DictReader(f):
            out[row["app"]] = KernelRow(
                app=row["app"],
                name=row["name"],
                stall=StallReasons(
                    exec_dependency=float(row["exec_dependency_pct"]),
                    instruction_fetch=float(row["instruction_fetch_pct"]),
                    memory_dependency=float(row["memory_dependency_pct"]),
                    texture=float(row["texture_pct"]),
                    synchronization=float(row["synchronization_pct"]),
                    other=float(row["others_pct"]),
                ),
                epc=float(row["eligible_warps_per_cycle"]),
                kind=row["type"],
                registers_per_block=int(row["registers_per_block"]),
                smem_per_block_bytes=int(row["smem_per_block_bytes"]),
            )
    return out


def static_tb_limit(
    registers_per_block: int | None, smem_per_block: int | None, limits: SmLimits = TITAN_XP
) -> int:
    """Most thread blocks of one kernel an SM can hold (registers, shared memory, block slots).
    Threads per block are not in Table 7 and are assumed small enough never to bind."""
    cap = limits.max_tbs
    if registers_per_block:
        cap = min(cap, limits.max_regs // registers_per_block)
    if smem_per_block:
        cap = min(cap, limits.max_smem_bytes // smem_per_block)
    return max(1, cap)


def knee_from_epc(epc: float, tb_limit: int) -> int:
    """Saturation point (thread blocks per SM) predicted from EPC (see the module docstring)."""
    knee = round(KNEE_A + KNEE_B * math.log(max(epc, 1e-3)))
    return max(1, min(tb_limit, knee))


def curve_exponent(epc: float) -> float:
    """``beta`` of the scalability curve: how much a kernel gains per extra block."""
    return BETA_MAX * epc / (epc + BETA_HALF)


def scalability(j: float, knee: float, beta: float) -> float:
    """Solo performance with ``j`` thread blocks per SM on all SMs, relative to the knee's."""
    if j <= 0:
        return 0.0
    return (min(j, knee) / knee) ** beta


def perf_table(profile: Profile, limits: SmLimits = TITAN_XP) -> list[float]:
    """``Perf[30][j]`` for j = 1 .. the kernel's static limit (index 0 is j = 1): the curve
    the thesis profiles per kernel and ``saturation_point`` reads."""
    tb_limit = static_tb_limit(profile.registers_per_block, profile.smem_per_block_bytes, limits)
    knee, beta = kernel_knee(profile, limits), curve_exponent(profile.epc or 1.0)
    return [scalability(j, knee, beta) for j in range(1, tb_limit + 1)]


def kernel_knee(profile: Profile, limits: SmLimits = TITAN_XP) -> int:
    """The model's knee for ``profile``: the observed one for the four measured kernels,
    else from EPC."""
    if profile.name in OBSERVED_KNEE:
        return OBSERVED_KNEE[profile.name]
    tb_limit = static_tb_limit(profile.registers_per_block, profile.smem_per_block_bytes, limits)
    return knee_from_epc(profile.epc or 1.0, tb_limit)


def saturation_point(perf: Sequence[float], rate_tb: float = 0.05, w_size: int = 2) -> int:
    """The thesis' saturation point (§4.3.2, ALGORITHMS §3) from ``perf[j-1]`` = performance
    with ``j`` thread blocks per SM: the smallest ``j`` such that for every ``w`` in
    ``1..w_size``, ``perf[j] * (1 + rate_tb) ** w >= perf[j + w]`` (more blocks no longer buy
    ``rate_tb`` per step). Windows reaching past the table compare with its last entry."""
    if not perf:
        raise ValueError("empty performance table")
    n = len(perf)
    for j in range(1, n + 1):
        ok = True
        for w in range(1, w_size + 1):
            nxt = perf[min(j + w, n) - 1]
            if perf[j - 1] * (1.0 + rate_tb) ** w < nxt:
                ok = False
                break
        if ok:
            return j
    return n


def footprint(profile: Profile, tbs: float, limits: SmLimits = TITAN_XP) -> float:
    """Share of an SM (0..1) that ``tbs`` blocks of the kernel take: its largest share of
    registers, shared memory or block slots."""
    shares = [tbs / limits.max_tbs]
    if profile.registers_per_block:
        shares.append(tbs * profile.registers_per_block / limits.max_regs)
    if profile.smem_per_block_bytes:
        shares.append(tbs * profile.smem_per_block_bytes / limits.max_smem_bytes)
    return max(shares)


def share_for_saturation(profile: Profile, limits: SmLimits = TITAN_XP) -> int:
    """MPS active-thread percentage (1..100) for a kernel: the share of an SM its blocks take
    at its saturation point (``Profile.saturation_tbs_per_sm``, else the model's knee)."""
    sat = profile.saturation_tbs_per_sm or kernel_knee(profile, limits)
    return max(1, min(100, math.ceil(100.0 * footprint(profile, sat, limits) - 1e-9)))


def tbs_for_share(profile: Profile, share: float, limits: SmLimits = TITAN_XP) -> int:
    """Most blocks per SM whose footprint stays within ``share`` (0..1], at least 1, at most
    the static limit: how an active-thread percentage becomes a block allocation."""
    tb_limit = static_tb_limit(profile.registers_per_block, profile.smem_per_block_bytes, limits)
    per_tb = footprint(profile, 1, limits)
    j = math.floor(share / per_tb + 1e-9) if per_tb > 0 else tb_limit
    return max(1, min(tb_limit, j))


def dram_demand(profile: Profile) -> float:
    """DRAM bandwidth (GB/s) the kernel draws at solo speed (module docstring)."""
    if profile.dram_bw_gbps is not None:
        return profile.dram_bw_gbps
    stall = profile.stall or StallReasons()
    return DRAM_PER_MEMORY_SHARE * stall.memory_dependency / 100.0


def l1_proxy(stall: StallReasons) -> float:
    """ASSUMED L1-transaction proxy (percent-like units): texture + memory dependency / 2."""
    return stall.texture + stall.memory_dependency / 2.0


def is_kernel(profile: Profile | None) -> bool:
    """Whether the kernel model applies: stall reasons, EPC and registers per block known."""
    return (
        profile is not None
        and profile.stall is not None
        and profile.epc is not None
        and profile.registers_per_block is not None
    )


def corun_speeds(
    profiles: Sequence[Profile], shares: Sequence[float], limits: SmLimits = TITAN_XP
) -> list[float]:
    """Speed of each kernel (1 = its solo speed at its knee) when they run together on one
    GPU with the given SM shares (0..1], in order (module docstring)."""
    n = len(profiles)
    if n == 0:
        return []
    tbs = [float(tbs_for_share(p, s, limits)) for p, s in zip(profiles, shares, strict=True)]
    # Blocks that do not fit an SM together are scaled down in proportion.
    scale = 1.0
    for need, cap in (
        ([p.registers_per_block or 0 for p in profiles], limits.max_regs),
        ([p.smem_per_block_bytes or 0 for p in profiles], limits.max_smem_bytes),
        ([1] * n, limits.max_tbs),
    ):
        total = sum(j * r for j, r in zip(tbs, need, strict=True))
        if total > cap:
            scale = min(scale, cap / total)
    tbs = [max(1e-6, j * scale) for j in tbs]
    perf = [
        scalability(j, kernel_knee(p, limits), curve_exponent(p.epc or 1.0))
        for j, p in zip(tbs, profiles, strict=True)
    ]
    stalls = [p.stall or StallReasons() for p in profiles]
    mem = [s.memory_dependency / 100.0 for s in stalls]
    tex = [s.texture / 100.0 for s in stalls]
    l1 = [l1_proxy(s) / 100.0 for s in stalls]
    issue = sum(min(1.0, p.epc or 1.0) * f for p, f in zip(profiles, perf, strict=True))
    f_issue = max(1.0, issue)
    bw = sum(dram_demand(p) * f for p, f in zip(profiles, perf, strict=True))
    f_bw = max(1.0, bw / limits.dram_bw_gbps)
    flops = sum((p.gflops or 0.0) * f for p, f in zip(profiles, perf, strict=True))
    f_flops = max(1.0, flops / limits.gflops)
    mem_load = sum(m * f for m, f in zip(mem, perf, strict=True))
    l1_load = sum(x * f for x, f in zip(l1, perf, strict=True))
    out = []
    for i, p in enumerate(profiles):
        compute_part = max(0.0, 1.0 - mem[i] - tex[i])
        f_compute = max(f_issue, f_flops) if p.gflops else f_issue
        f_mem = f_bw * (1.0 + KAPPA * (mem_load - mem[i] * perf[i]))
        f_tex = 1.0 + LAMBDA * (l1_load - l1[i] * perf[i])
        stretch = compute_part * f_compute + mem[i] * f_mem + tex[i] * f_tex
        out.append(perf[i] / stretch if stretch > 0 else perf[i])
    return out


def kernel_profile(app: str, limits: SmLimits = TITAN_XP) -> Profile:
    """The ``Profile`` of Table 7's kernel ``app`` with the model's figures (module docstring):
    solo time on the Titan Xp, saturation point from the model's ``Perf`` table and the
    thesis' algorithm, DRAM and compute demand, L1 proxy."""
    row = table7()[app]
    base = Profile(
        name=app,
        kind=JobKind.HPC,
        gpu_time_s={GPU_MODEL: SOLO_MS[app] / 1000.0},
        gpu_memory_max_mb=256.0,
        stall=row.stall,
        epc=row.epc,
        registers_per_block=row.registers_per_block,
        smem_per_block_bytes=row.smem_per_block_bytes,
        l1_transactions=l1_proxy(row.stall),
        gflops=GFLOPS.get(app),
    )
    sat = saturation_point(perf_table(base, limits))
    from dataclasses import replace

    return replace(
        base,
        saturation_tbs_per_sm=sat,
        dram_bw_gbps=DRAM_GBPS.get(app, dram_demand(base)),
    )


def kernel_profiles(limits: SmLimits = TITAN_XP) -> dict[str, Profile]:
    """Every Table 7 kernel's profile, keyed by short name; each kernel's class is Table 7's
    (``scheduler.classes.kernel_class`` reproduces all 18)."""
    out = {app: kernel_profile(app, limits) for app in table7()}
    for app, profile in out.items():
        if kernel_class(profile) != table7()[app].kind:  # pragma: no cover - data check
            raise ValueError(f"kernel {app}: class {kernel_class(profile)} != Table 7")
    return out


def pair_speedup(a: Profile, b: Profile, shares: tuple[float, float] = (1.0, 1.0)) -> float:
    """Sequential time / co-run time of two kernels started together (the thesis' pair
    metric): when one ends the other runs on alone, keeping its block allocation."""
    ta, tb = (p.gpu_time_s[GPU_MODEL] for p in (a, b))
    sa, sb = corun_speeds([a, b], list(shares))
    # Phase 1 until the first finishes; then the other alone with its own share.
    t1 = min(ta / sa, tb / sb)
    left_a, left_b = 1.0 - t1 * sa / ta, 1.0 - t1 * sb / tb
    alone_a = corun_speeds([a], [shares[0]])[0]
    alone_b = corun_speeds([b], [shares[1]])[0]
    t2 = max(left_a * ta / alone_a, left_b * tb / alone_b)
    return (ta + tb) / (t1 + t2)


def pair_model_vs_thesis(limits: SmLimits = TITAN_XP) -> list[tuple[str, str, float, float]]:
    """(a, b, thesis, model) for every pair in ``PAIR_OBSERVATIONS``, each kernel at its
    saturation share (how the contention constants were fitted)."""
    ps = kernel_profiles(limits)
    out = []
    for (a, b), obs in PAIR_OBSERVATIONS.items():
        shares = (
            share_for_saturation(ps[a], limits) / 100.0,
            share_for_saturation(ps[b], limits) / 100.0,
        )
        out.append((a, b, obs, pair_speedup(ps[a], ps[b], shares)))
    return out


KAPPA_GRID = tuple(k / 10 for k in range(0, 61))  # 0.0 .. 6.0
LAMBDA_GRID = tuple(k / 2 for k in range(0, 41))  # 0.0 .. 20.0


def fit_contention(
    kappas: Sequence[float] = KAPPA_GRID, lambdas: Sequence[float] = LAMBDA_GRID
) -> tuple[float, float, float]:
    """Grid search of (KAPPA, LAMBDA) minimising the squared log error over the pairs;
    returns (kappa, lambda, rms log error). Restores the module constants afterwards."""
    global KAPPA, LAMBDA
    saved = (KAPPA, LAMBDA)
    best = (math.inf, saved[0], saved[1])
    try:
        for kappa in kappas:
            for lam in lambdas:
                KAPPA, LAMBDA = kappa, lam
                err = sum(math.log(m / obs) ** 2 for _, _, obs, m in pair_model_vs_thesis())
                best = min(best, (err, kappa, lam))
    finally:
        KAPPA, LAMBDA = saved
    err, kappa, lam = best
    return kappa, lam, math.sqrt(err / len(PAIR_OBSERVATIONS))


def profiles_yaml_text(limits: SmLimits = TITAN_XP) -> str:
    """The kscheduler003 scenario's profiles file, as text (a test keeps the file equal to it:
    change the model here, then rewrite the file with this function)."""
    lines = [
        "# Table 7's 18 kernels (thesis 003, chapter IV) on the Titan Xp, as the kscheduler003",
        "# scenario's profiles. GENERATED by scheduler.kernels.profiles_yaml_text(): stall",
        "# reasons, EPC, registers and shared memory per block from Table 7; solo time, DRAM",
        "# demand, L1 proxy and saturation point from the model in scheduler/kernels.py (its",
        "# docstring says which are measured and which ASSUMED). Times in seconds.",
        "profiles:",
    ]
    fields = (
        "exec_dependency",
        "instruction_fetch",
        "memory_dependency",
        "texture",
        "synchronization",
        "other",
    )
    for app, p in kernel_profiles(limits).items():
        stall = p.stall or StallReasons()
        stall_text = ", ".join(f"{f}: {getattr(stall, f):g}" for f in fields)
        lines += [
            f"- name: {app}",
            "  kind: hpc",
            f"  gpu_time_s: {{{GPU_MODEL}: {p.gpu_time_s[GPU_MODEL]:g}}}",
            f"  gpu_memory_max_mb: {p.gpu_memory_max_mb:g}",
            f"  stall: {{{stall_text}}}",
            f"  epc: {p.epc:g}",
            f"  registers_per_block: {p.registers_per_block}",
            f"  smem_per_block_bytes: {p.smem_per_block_bytes}",
            f"  saturation_tbs_per_sm: {p.saturation_tbs_per_sm}",
            f"  dram_bw_gbps: {p.dram_bw_gbps:.4g}",
            f"  l1_transactions: {p.l1_transactions:.4g}",
        ]
        if p.gflops is not None:
            lines.append(f"  gflops: {p.gflops:g}")
    return "\n".join(lines) + "\n"
