"""Built-in GPU catalogue: the models Cosched knows, keyed by their short name.

Figures are the vendors' published specifications (memory, SMs, DRAM bandwidth, FP32 peak).

Sharing modes (ALGORITHMS.md §4 Table 1, corrected where the paper is narrower than the
hardware; docs/sharing.md has the table per model):

- **time-slicing**: every model.
- **MPS**: Kepler and later, i.e. every model here. Paper 001 says "Volta and newer" because
  pre-Volta MPS lacks per-client address spaces and the execution-resource limit; it runs all
  the same. ``GpuSpec.mps_thread_limit`` says whether the GPU honours
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (Volta and later): policies give a percentage only
  there. One MPS server serves one unix user at a time per GPU.
- **MIG**: Ampere A30 / A100 and Hopper H100 / H200, with fixed instance profiles (``mig_profiles``)
  and placement rules (``MIG_PLACEMENTS``): an instance of width ``w`` may start only at the
  listed slots of the GPU's ``MIG_SLOTS`` memory slices, and instances may not overlap. That
  is what makes some layouts impossible (two ``3g.20gb`` and a ``1g.5gb`` on an A100: the
  ``3g`` instances take all eight memory slices). ``valid_mig_layout`` and ``mig_layouts``
  answer from these rules. Source: NVIDIA MIG user guide, "Supported MIG profiles" (A30-24GB,
  A100-SXM4-40GB, H100-80GB, H200-141GB tables and placement diagrams).

A cluster spec may override any field of a model (e.g. restrict ``sharing_modes`` to what a
site configured, as the ``sharing001`` scenario does).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from scheduler.domain import GpuSpec, MigProfile, SharingMode

_TS = (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICING)
_MPS = (*_TS, SharingMode.MPS)
_MIG = (*_MPS, SharingMode.MIG)

#: Architectures in release order; MPS's active-thread limit arrived with Volta.
ARCHITECTURES = ("Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper")
THREAD_LIMIT_FROM = "Volta"


def has_mps_thread_limit(architecture: str) -> bool:
    """True if ``architecture`` honours ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (Volta on).
    Unknown architectures (a model a cluster spec defines) answer False: no limit assumed."""
    try:
        return ARCHITECTURES.index(architecture) >= ARCHITECTURES.index(THREAD_LIMIT_FROM)
    except ValueError:
        return False


def _mig(*profiles: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, slices, gb * 1024) for name, slices, gb in profiles)


def _gpu(
    model: str,
    arch: str,
    memory_mb: int,
    sms: int,
    bw: float,
    gflops: float,
    modes: tuple[SharingMode, ...],
    migs: tuple[MigProfile, ...] = (),
    mig_slices: int = 0,
) -> GpuSpec:
    return GpuSpec(
        model, arch, memory_mb, sms, bw, gflops, modes, migs, mig_slices, has_mps_thread_limit(arch)
    )


CATALOG: dict[str, GpuSpec] = {
    spec.model: spec
    for spec in (
        _gpu("K80", "Kepler", 11441, 13, 240.0, 4370.0, _MPS),
        _gpu("P100", "Pascal", 16280, 56, 732.0, 9300.0, _MPS),
        _gpu("V100", "Volta", 16160, 80, 900.0, 15700.0, _MPS),
        _gpu("T4", "Turing", 15360, 40, 320.0, 8100.0, _MPS),
        _gpu("TitanXp", "Pascal", 12288, 30, 547.6, 12150.0, _MPS),
        _gpu("RTX2080Ti", "Turing", 11264, 68, 616.0, 13450.0, _MPS),
        _gpu("QuadroRTX6000", "Turing", 24576, 72, 672.0, 16300.0, _MPS),
        _gpu(
            "A30",
            "Ampere",
            24576,
            56,
            933.0,
            10300.0,
            _MIG,
            _mig(("1g.6gb", 1, 6), ("2g.12gb", 2, 12), ("4g.24gb", 4, 24)),
            4,
        ),
        _gpu(
            "A100",
            "Ampere",
            40960,
            108,
            1555.0,
            19500.0,
            _MIG,
            _mig(
                ("1g.5gb", 1, 5),
                ("2g.10gb", 2, 10),
                ("3g.20gb", 3, 20),
                ("4g.20gb", 4, 20),
                ("7g.40gb", 7, 40),
            ),
            7,
        ),
        _gpu(
            "H100",
            "Hopper",
            81920,
            132,
            3350.0,
            67000.0,
            _MIG,
            _mig(
                ("1g.10gb", 1, 10),
                ("2g.20gb", 2, 20),
                ("3g.40gb", 3, 40),
                ("4g.40gb", 4, 40),
                ("7g.80gb", 7, 80),
            ),
            7,
        ),
        # H200 (SXM, 141 GB HBM3e; NVML reports 143,771 MiB): the H100's SMs and placement
        # rules with more memory per instance (NVIDIA MIG user guide, H200-141GB table).
        _gpu(
            "H200",
            "Hopper",
            143771,
            132,
            4800.0,
            67000.0,
            _MIG,
            _mig(
                ("1g.18gb", 1, 18),
                ("2g.35gb", 2, 35),
                ("3g.71gb", 3, 71),
                ("4g.71gb", 4, 71),
                ("7g.141gb", 7, 141),
            ),
            7,
        ),
    )
}

#: MIG placement rules per model: memory slices of the GPU, and per profile its width in those
#: slices and the slices it may start at (NVIDIA MIG user guide placement diagrams).
MIG_SLOTS: dict[str, int] = {"A30": 4, "A100": 8, "H100": 8, "H200": 8}
MIG_PLACEMENTS: dict[str, dict[str, tuple[int, tuple[int, ...]]]] = {
    "A30": {
        "1g.6gb": (1, (0, 1, 2, 3)),
        "2g.12gb": (2, (0, 2)),
        "4g.24gb": (4, (0,)),
    },
    "A100": {
        "1g.5gb": (1, (0, 1, 2, 3, 4, 5, 6)),
        "2g.10gb": (2, (0, 2, 4)),
        "3g.20gb": (4, (0, 4)),
        "4g.20gb": (4, (0,)),
        "7g.40gb": (8, (0,)),
    },
    "H100": {
        "1g.10gb": (1, (0, 1, 2, 3, 4, 5, 6)),
        "2g.20gb": (2, (0, 2, 4)),
        "3g.40gb": (4, (0, 4)),
        "4g.40gb": (4, (0,)),
        "7g.80gb": (8, (0,)),
    },
    "H200": {
        "1g.18gb": (1, (0, 1, 2, 3, 4, 5, 6)),
        "2g.35gb": (2, (0, 2, 4)),
        "3g.71gb": (4, (0, 4)),
        "4g.71gb": (4, (0,)),
        "7g.141gb": (8, (0,)),
    },
}


class MigLayoutError(ValueError):
    """A MIG layout that the GPU model cannot hold (unknown profile, overlap, too many)."""


def _placement_rules(spec: GpuSpec) -> tuple[int, dict[str, tuple[int, tuple[int, ...]]]]:
    """(slots, profile -> (width, starts)) for ``spec``: the catalogue's rules, or, for a model
    defined in a cluster spec, a plain one (compute slices as width, any start)."""
    rules = MIG_PLACEMENTS.get(spec.model)
    if rules is not None and all(p.name in rules for p in spec.mig_profiles):
        return MIG_SLOTS[spec.model], rules
    slots = spec.mig_total_slices
    return slots, {
        p.name: (p.compute_slices, tuple(range(slots - p.compute_slices + 1)))
        for p in spec.mig_profiles
    }


def place_mig_layout(spec: GpuSpec, layout: Sequence[str]) -> tuple[int, ...] | None:
    """Start slots for each instance of ``layout`` (in its order), or None if the instances
    cannot all be placed without overlapping. Raises MigLayoutError for an unknown profile."""
    slots, rules = _placement_rules(spec)
    for name in layout:
        if name not in rules:
            known = ", ".join(p.name for p in spec.mig_profiles) or "none (no MIG)"
            raise MigLayoutError(f"{spec.model} has no MIG profile {name!r}; known: {known}")
    return _place(slots, tuple((rules[n][0], rules[n][1]) for n in layout))


@functools.lru_cache(maxsize=4096)
def _place(slots: int, items: tuple[tuple[int, tuple[int, ...]], ...]) -> tuple[int, ...] | None:
    # Widest first (fewest choices), backtracking over the allowed starts; tiny inputs.
    order = sorted(range(len(items)), key=lambda i: -items[i][0])
    taken = [False] * slots
    starts = [0] * len(items)

    def go(k: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        width, allowed = items[i]
        for s in allowed:
            if s + width <= slots and not any(taken[s : s + width]):
                for t in range(s, s + width):
                    taken[t] = True
                starts[i] = s
                if go(k + 1):
                    return True
                for t in range(s, s + width):
                    taken[t] = False
        return False

    return tuple(starts) if go(0) else None


def _compute_slices(spec: GpuSpec, layout: Sequence[str]) -> int:
    return sum(p.compute_slices for p in map(spec.mig_profile, layout) if p is not None)


def valid_mig_layout(spec: GpuSpec, layout: Sequence[str]) -> bool:
    """Whether a GPU of ``spec`` can hold the instances ``layout`` at once (compute slices and
    the placement rules); False for an unknown profile or a model without MIG."""
    return _valid_layout(spec, tuple(sorted(layout)))


@functools.lru_cache(maxsize=8192)
def _valid_layout(spec: GpuSpec, layout: tuple[str, ...]) -> bool:
    if not spec.mig_profiles:
        return not layout
    try:
        placed = place_mig_layout(spec, layout)
    except MigLayoutError:
        return False
    slices = _compute_slices(spec, layout)
    return placed is not None and slices <= spec.mig_total_slices


def check_mig_layout(spec: GpuSpec, layout: Sequence[str]) -> None:
    """Raise MigLayoutError saying why ``layout`` does not fit a GPU of ``spec``."""
    if not spec.mig_profiles:
        if layout:
            raise MigLayoutError(f"{spec.model} has no MIG")
        return
    placed = place_mig_layout(spec, layout)  # raises on an unknown profile
    slices = _compute_slices(spec, layout)
    if slices > spec.mig_total_slices:
        raise MigLayoutError(
            f"{' + '.join(layout)} needs {slices} compute slices; a {spec.model} has "
            f"{spec.mig_total_slices}"
        )
    if placed is None:
        raise MigLayoutError(
            f"{' + '.join(layout)} cannot be placed on a {spec.model}: the instances overlap "
            "whatever their start slots (MIG placement rules)"
        )


def can_add_mig_instances(spec: GpuSpec, in_use: Iterable[str], new: Iterable[str]) -> bool:
    """Whether instances ``new`` can be created next to the instances ``in_use`` (which stay
    where the driver put them; we check that some placement of all of them exists)."""
    return valid_mig_layout(spec, [*in_use, *new])


@functools.lru_cache(maxsize=64)
def _layouts(spec: GpuSpec) -> tuple[tuple[str, ...], ...]:
    names = [p.name for p in sorted(spec.mig_profiles, key=lambda p: -p.compute_slices)]
    found: set[tuple[str, ...]] = set()

    def grow(current: list[str], first: int) -> None:
        extended = False
        for i in range(first, len(names)):
            candidate = [*current, names[i]]
            if valid_mig_layout(spec, candidate):
                extended = True
                grow(candidate, i)
        if current and not extended:
            found.add(tuple(current))

    grow([], 0)
    # Keep the maximal layouts only (no instance can be added to them).
    maximal = [lay for lay in found if not any(valid_mig_layout(spec, [*lay, n]) for n in names)]
    return tuple(sorted(maximal, key=lambda lay: (len(lay), lay)))


def mig_layouts(spec: GpuSpec) -> tuple[tuple[str, ...], ...]:
    """Every maximal layout of ``spec`` (no further instance fits), widest instances first
    inside a layout; () for a model without MIG. A30: 4g.24gb; 2g+2g; 2g+1g+1g; 1g x4."""
    return _layouts(spec) if spec.mig_profiles else ()


def layout_counts(layout: Iterable[str]) -> Mapping[str, int]:
    """Instances per profile of a layout."""
    return Counter(layout)


def sharing_summary(spec: GpuSpec) -> str:
    """One line on what a model allows, for docs and the cluster page."""
    modes = [m.value for m in spec.sharing_modes]
    text = ", ".join(modes)
    if SharingMode.MPS in spec.sharing_modes:
        text += " (MPS thread limit)" if spec.mps_thread_limit else " (MPS without thread limit)"
    if spec.mig_profiles:
        text += "; MIG profiles " + ", ".join(p.name for p in spec.mig_profiles)
    return text


# Other spellings seen in traces and NVML device names -> catalogue key.
ALIASES: dict[str, str] = {
    "k80": "K80",
    "tesla k80": "K80",
    "p100": "P100",
    "tesla p100-pcie-16gb": "P100",
    "v100": "V100",
    "tesla v100-sxm2-16gb": "V100",
    "v100m16": "V100",
    "v100m32": "V100",
    "t4": "T4",
    "tesla t4": "T4",
    "titan xp": "TitanXp",
    "titanxp": "TitanXp",
    "nvidia titan xp": "TitanXp",
    "rtx 2080 ti": "RTX2080Ti",
    "rtx2080ti": "RTX2080Ti",
    "geforce rtx 2080 ti": "RTX2080Ti",
    "quadro rtx 6000": "QuadroRTX6000",
    "quadrortx6000": "QuadroRTX6000",
    "a30": "A30",
    "nvidia a30": "A30",
    "a100": "A100",
    "nvidia a100-sxm4-40gb": "A100",
    "a100-sxm4-80gb": "A100",
    "h100": "H100",
    "nvidia h100 80gb hbm3": "H100",
    "h200": "H200",
    "nvidia h200": "H200",
}


class UnknownGpuModel(KeyError):
    def __str__(self) -> str:
        return f"unknown GPU model {self.args[0]!r}; known: {', '.join(sorted(CATALOG))}"


def canonical_model(name: str) -> str:
    """The catalogue key for ``name`` (case and spelling tolerant); raises UnknownGpuModel."""
    if name in CATALOG:
        return name
    key = ALIASES.get(name.strip().lower())
    if key is None:
        raise UnknownGpuModel(name)
    return key


def gpu_spec(name: str) -> GpuSpec:
    """The catalogue entry for ``name``; raises UnknownGpuModel with the known names."""
    return CATALOG[canonical_model(name)]
