"""Built-in GPU catalogue: the models Cosched knows, keyed by their short name.

Figures are the vendors' published specifications (memory, SMs, DRAM bandwidth, FP32 peak).
Sharing modes follow ALGORITHMS.md §4 Table 1: time-slicing everywhere, MPS from Volta on
(Turing included), MIG on Ampere A30/A100 and Hopper H100. A cluster spec may override any field.
"""

from __future__ import annotations

from scheduler.domain import GpuSpec, MigProfile, SharingMode

_TS = (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICING)
_MPS = (*_TS, SharingMode.MPS)
_MIG = (*_MPS, SharingMode.MIG)


def _mig(*profiles: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, slices, gb * 1024) for name, slices, gb in profiles)


CATALOG: dict[str, GpuSpec] = {
    spec.model: spec
    for spec in (
        GpuSpec("K80", "Kepler", 11441, 13, 240.0, 4370.0, _TS),
        GpuSpec("P100", "Pascal", 16280, 56, 732.0, 9300.0, _TS),
        GpuSpec("V100", "Volta", 16160, 80, 900.0, 15700.0, _MPS),
        GpuSpec("T4", "Turing", 15360, 40, 320.0, 8100.0, _MPS),
        GpuSpec("TitanXp", "Pascal", 12288, 30, 547.6, 12150.0, _TS),
        GpuSpec("RTX2080Ti", "Turing", 11264, 68, 616.0, 13450.0, _MPS),
        GpuSpec("QuadroRTX6000", "Turing", 24576, 72, 672.0, 16300.0, _MPS),
        GpuSpec(
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
        GpuSpec(
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
        GpuSpec(
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
    )
}

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
