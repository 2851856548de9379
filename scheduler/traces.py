"""Trace readers: job arrival files -> ``JobSpec`` lists (sorted by arrival, stable).

Three formats (docs/simulator.md describes them column by column):

1. **Gavel trace CSV** (``job_id, job_type, arrival_time_s, total_steps, scale_factor``, ...):
   the run time on GPU model g is ``total_steps / throughput(job_type, scale_factor, g)`` from
   the consolidated rows of ``data/gavel/solo_throughput.csv``. The job's Profile holds those
   run times for K80/P100/V100 (models with throughput 0, i.e. infeasible, are left out);
   ``job_type`` is kept for the measured interference table. No GPU memory is known: 0 MB.
2. **Profile trace CSV** (Cosched's own): one row per job naming a profile; the profiles live
   in a YAML file (every ``Profile`` field by name). Used by the seed scenarios and the
   portal's job-history export (``write_profile_trace``).
3. **Alibaba pod list** (cluster-trace-gpu-v2023 ``openb_pod_list_default.csv``): arrival =
   ``creation_time``, duration = ``deletion_time - creation_time`` on any GPU model;
   ``gpu_milli < 1000`` marks a fractional (shared) GPU job, kept in ``params``.

Errors name the file, the line and the field (``InputError``).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from scheduler.catalog import CATALOG, UnknownGpuModel, canonical_model
from scheduler.csv_reading import csv_header, csv_rows
from scheduler.domain import JobKind, JobSpec, MemoryStep, Profile, StallReasons
from scheduler.inputs import (
    MAX_JOB_GPUS,
    MAX_MB,
    MAX_SECONDS,
    MAX_STEPS,
    FieldLoc,
    InputError,
    Loc,
    line_of,
    load_yaml,
    require_mapping,
    to_float,
    to_int,
)

# The CSV reading and the throughput tables live in ``scheduler.csv_reading`` and
# ``scheduler.throughputs`` (the trace generator reads them too); they stay importable here.
from scheduler.throughputs import GAVEL_SOLO_CSV as GAVEL_SOLO_CSV
from scheduler.throughputs import (
    ThroughputTable,
    load_solo_throughputs,
    load_unconsolidated_throughputs,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
GAVEL_TRACES_DIR = DATA_DIR / "gavel" / "traces"

GAVEL_COLUMNS = ("job_id", "job_type", "arrival_time_s", "total_steps", "scale_factor")
PROFILE_TRACE_COLUMNS = ("job_id", "arrival_s", "profile")
PROFILE_TRACE_OPTIONAL = (
    "name",
    "gpus",
    "gpu_memory_mb",
    "cpus",
    "memory_mb",
    "priority",
    "kind",
    "job_type",
    "owner",  # who submitted it (the portal's export: a user name); MPS and per-user reports
)
ALIBABA_COLUMNS = ("name", "cpu_milli", "num_gpu", "gpu_milli", "creation_time", "deletion_time")


# --------------------------------------------------------------------------------------------
# Gavel


def read_gavel_trace(
    path: str | Path,
    *,
    throughputs: ThroughputTable | None = None,
    unconsolidated: ThroughputTable | None = None,
) -> list[JobSpec]:
    """Jobs of a Gavel trace CSV, with Profiles whose ``gpu_time_s`` (seconds) come from the
    solo-throughput table and, for multi-GPU jobs, ``gpu_time_unconsolidated_s`` from its
    unconsolidated rows (the time when spread over several nodes). Raises InputError for
    unknown job types, bad numbers, missing columns."""
    table = throughputs if throughputs is not None else load_solo_throughputs()
    if unconsolidated is None:
        unconsolidated = {} if throughputs is not None else load_unconsolidated_throughputs()
    profiles: dict[tuple[str, int, float], Profile] = {}
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for line, row in csv_rows(path, GAVEL_COLUMNS):
        loc: Loc = {"file": path, "line": line}
        job_id = row["job_id"]
        if not job_id:
            raise InputError("missing value", field="job_id", **loc)
        if job_id in seen:
            raise InputError(f"job id {job_id!r} used twice", field="job_id", **loc)
        seen.add(job_id)
        job_type = row["job_type"]
        arrival = to_float(
            row["arrival_time_s"], field="arrival_time_s", minimum=0, maximum=MAX_SECONDS, **loc
        )
        # A job with no steps has no work: refused rather than "completed" at its arrival.
        steps = to_float(
            row["total_steps"], field="total_steps", positive=True, maximum=MAX_STEPS, **loc
        )
        scale = to_int(
            row["scale_factor"], field="scale_factor", minimum=1, maximum=MAX_JOB_GPUS, **loc
        )
        tputs = table.get((job_type, scale))
        if tputs is None:
            known_types = sorted({t for t, _ in table})
            if job_type not in known_types:
                raise InputError(
                    f"unknown job type {job_type!r}; the throughput table knows "
                    f"{len(known_types)} types, e.g. {', '.join(known_types[:3])}",
                    field="job_type",
                    **loc,
                )
            scales = sorted(s for t, s in table if t == job_type)
            raise InputError(
                f"job type {job_type!r} was not measured at scale factor {scale}; "
                f"measured: {', '.join(map(str, scales))}",
                field="scale_factor",
                **loc,
            )
        if not tputs:
            raise InputError(
                f"job type {job_type!r} is infeasible on every GPU model", field="job_type", **loc
            )
        assert arrival is not None and steps is not None
        key = (job_type, scale, steps)
        profile = profiles.get(key)
        if profile is None:
            spread = unconsolidated.get((job_type, scale), {}) if scale > 1 else {}
            profile = Profile(
                name=job_type if scale == 1 else f"{job_type} x{scale}",
                kind=JobKind.DL_TRAIN,
                gpu_time_s={m: steps / t for m, t in sorted(tputs.items())},
                gpu_time_unconsolidated_s={
                    m: steps / t for m, t in sorted(spread.items()) if m in tputs
                },
                batch_size=_int_or_none(row.get("batch_size")),
            )
            profiles[key] = profile
        params: dict[str, Any] = {"total_steps": steps}
        if row.get("priority_weight"):
            params["priority_weight"] = to_float(
                row["priority_weight"], field="priority_weight", minimum=0, maximum=1e6, **loc
            )
        jobs.append(
            JobSpec(
                id=job_id,
                name=row.get("model") or job_type,
                kind=JobKind.DL_TRAIN,
                arrival_s=arrival,
                gpus=scale,
                profile=profile,
                job_type=job_type,
                params=params,
            )
        )
    return _by_arrival(jobs)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# Profiles (YAML) and the profile trace


_PROFILE_FIELDS = {f.name: f for f in dataclasses.fields(Profile)}
_STALL_FIELDS = {f.name for f in dataclasses.fields(StallReasons)}


def load_profiles(path: str | Path) -> dict[str, Profile]:
    """Profiles from a YAML file ``profiles: [{name, kind, cpu_time_s, gpu_time_s: {model: s},
    gpu_memory_max_mb, memory_steps: [{start_fraction, from_mb, to_mb}], ...}]``.

    Any ``Profile`` field may be given; GPU model names are canonicalised against the
    catalogue. Raises InputError naming file, line and field.
    """
    return parse_profiles(load_yaml(path), source=path)


def parse_profiles(data: Any, *, source: str | Path = "<profiles>") -> dict[str, Profile]:
    """Like ``load_profiles`` for already parsed YAML."""
    top = require_mapping(data, file=source, line=line_of(data, 0), field="profiles")
    items = top.get("profiles")
    if not isinstance(items, list):
        raise InputError(
            "expected a list under 'profiles'",
            file=source,
            line=line_of(top, "profiles"),
            field="profiles",
        )
    out: dict[str, Profile] = {}
    for i, item in enumerate(items):
        iline = line_of(items, i)
        item = require_mapping(item, file=source, line=iline, field=f"profiles[{i}]")
        profile = _parse_profile(item, i, source, iline)
        if profile.name in out:
            raise InputError(
                f"profile {profile.name!r} defined twice",
                file=source,
                line=iline,
                field=f"profiles[{i}].name",
            )
        out[profile.name] = profile
    return out


def _parse_profile(item: Mapping, i: int, source: str | Path, iline: int | None) -> Profile:
    values: dict[str, Any] = {}
    for key, value in item.items():
        loc: FieldLoc = {
            "file": source,
            "line": line_of(item, key) or iline,
            "field": f"profiles[{i}].{key}",
        }
        fld = _PROFILE_FIELDS.get(key)
        if fld is None:
            raise InputError("unknown profile field", **loc)
        if value is None:
            continue
        values[key] = _profile_value(key, str(fld.type), value, loc)
    if "name" not in values:
        raise InputError(
            "every profile needs a name", file=source, line=iline, field=f"profiles[{i}].name"
        )
    return Profile(**values)


def _profile_value(key: str, type_text: str, value: Any, loc: FieldLoc) -> Any:
    if key == "name":
        return str(value)
    if key == "kind":
        try:
            return JobKind(str(value))
        except ValueError:
            known = ", ".join(k.value for k in JobKind)
            raise InputError(f"unknown kind {value!r}; known: {known}", **loc) from None
    if key in ("gpu_time_s", "gpu_time_unconsolidated_s"):
        value = require_mapping(value, **loc)
        times = {}
        for model, seconds in value.items():
            try:
                name = canonical_model(str(model))
            except UnknownGpuModel:
                name = str(model)  # may be a model the cluster spec defines
            # 0 marks a model the job cannot run on (Gavel's infeasible throughput)
            times[name] = to_float(seconds, minimum=0, maximum=MAX_SECONDS, **loc)
        return times
    if key == "memory_steps":
        if not isinstance(value, list):
            raise InputError("expected a list of {start_fraction, from_mb, to_mb}", **loc)
        steps = []
        for step in value:
            step = require_mapping(step, **loc)
            steps.append(
                MemoryStep(
                    start_fraction=to_float(
                        step.get("start_fraction"), minimum=0, maximum=1, **loc
                    ),
                    from_mb=to_float(step.get("from_mb"), minimum=0, maximum=MAX_MB, **loc),
                    to_mb=to_float(step.get("to_mb"), minimum=0, maximum=MAX_MB, **loc),
                )
            )
        steps.sort(key=lambda s: s.start_fraction)
        if steps and steps[-1].start_fraction >= 1:
            raise InputError("start_fraction must be < 1", **loc)
        return tuple(steps)
    if key == "stall":
        value = require_mapping(value, **loc)
        unknown = set(value) - _STALL_FIELDS
        if unknown:
            raise InputError(f"unknown stall reason(s) {', '.join(sorted(unknown))}", **loc)
        return StallReasons(
            **{k: to_float(v, minimum=0, maximum=100, **loc) for k, v in value.items()}
        )
    if type_text.startswith("int"):
        return to_int(value, minimum=0, **loc)
    if type_text.startswith("float"):
        if key == "cpu_time_s":  # a CPU job with no work: refused
            return to_float(value, positive=True, maximum=MAX_SECONDS, **loc)
        if key.endswith("_s"):
            return to_float(value, minimum=0, maximum=MAX_SECONDS, **loc)
        if key.endswith("_mb"):
            return to_float(value, minimum=0, maximum=MAX_MB, **loc)
        if key.endswith("_pct"):
            return to_float(value, minimum=0, maximum=100, **loc)
        return to_float(value, minimum=0, maximum=1e12, **loc)
    raise InputError("unsupported field type", **loc)  # pragma: no cover


def read_profile_trace(
    path: str | Path, profiles: Mapping[str, Profile] | str | Path
) -> list[JobSpec]:
    """Jobs of a Cosched profile trace CSV (columns in docs/simulator.md).

    ``profiles``: a name -> Profile mapping, or the path of a profiles YAML file.
    """
    if not isinstance(profiles, Mapping):
        profiles = load_profiles(profiles)
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for line, row in csv_rows(path, PROFILE_TRACE_COLUMNS):
        loc: Loc = {"file": path, "line": line}
        job_id = row["job_id"]
        if not job_id:
            raise InputError("missing value", field="job_id", **loc)
        if job_id in seen:
            raise InputError(f"job id {job_id!r} used twice", field="job_id", **loc)
        seen.add(job_id)
        profile = profiles.get(row["profile"])
        if profile is None:
            known = ", ".join(sorted(profiles)) or "none"
            raise InputError(
                f"unknown profile {row['profile']!r}; known: {known}", field="profile", **loc
            )
        kind = profile.kind
        if row.get("kind"):
            try:
                kind = JobKind(row["kind"])
            except ValueError:
                raise InputError(f"unknown kind {row['kind']!r}", field="kind", **loc) from None
        mem = to_float(
            row.get("gpu_memory_mb"),
            field="gpu_memory_mb",
            minimum=0,
            maximum=MAX_MB,
            allow_none=True,
            **loc,
        )
        jobs.append(
            JobSpec(
                id=job_id,
                name=row.get("name") or profile.name,
                kind=kind,
                arrival_s=to_float(
                    row["arrival_s"], field="arrival_s", minimum=0, maximum=MAX_SECONDS, **loc
                ),
                gpus=to_int(
                    row.get("gpus") or 1, field="gpus", minimum=0, maximum=MAX_JOB_GPUS, **loc
                ),
                gpu_memory_mb=mem,
                cpus=to_int(
                    row.get("cpus") or 1, field="cpus", minimum=1, maximum=MAX_JOB_GPUS, **loc
                ),
                memory_mb=to_float(
                    row.get("memory_mb") or 0, field="memory_mb", minimum=0, maximum=MAX_MB, **loc
                ),
                priority=to_int(row.get("priority") or 0, field="priority", **loc),
                profile=profile,
                job_type=row.get("job_type") or None,
                owner=row.get("owner") or None,
            )
        )
    return _by_arrival(jobs)


def write_profile_trace(
    jobs: Sequence[JobSpec], trace_path: str | Path, profiles_path: str | Path
) -> None:
    """Write ``jobs`` as a profile trace CSV plus its profiles YAML (the reverse of
    ``read_profile_trace``). Every job needs a profile; profiles are written once by name."""
    profiles: dict[str, Profile] = {}
    with open(trace_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(PROFILE_TRACE_COLUMNS + PROFILE_TRACE_OPTIONAL)
        for job in jobs:
            if job.profile is None:
                raise ValueError(f"job {job.id} has no profile")
            profiles.setdefault(job.profile.name, job.profile)
            writer.writerow(
                [
                    job.id,
                    repr(float(job.arrival_s)),
                    job.profile.name,
                    job.name,
                    job.gpus,
                    "" if job.gpu_memory_mb is None else job.gpu_memory_mb,
                    job.cpus,
                    job.memory_mb,
                    job.priority,
                    job.kind.value,
                    job.job_type or "",
                    job.owner or "",
                ]
            )
    docs = [profile_to_dict(p) for p in profiles.values()]
    Path(profiles_path).write_text(yaml.safe_dump({"profiles": docs}, sort_keys=False))


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """A Profile as plain YAML-able values, leaving out unset (None / empty) fields."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Profile):
        value = getattr(profile, f.name)
        if value is None or value == () or value == {}:
            continue
        if f.name == "kind":
            value = value.value
        elif f.name in ("gpu_time_s", "gpu_time_unconsolidated_s"):
            value = dict(value)
        elif f.name == "memory_steps":
            value = [dataclasses.asdict(s) for s in value]
        elif f.name == "stall":
            value = dataclasses.asdict(value)
        out[f.name] = value
    return out


# --------------------------------------------------------------------------------------------
# Alibaba


def read_alibaba_pods(path: str | Path, *, limit: int | None = None) -> list[JobSpec]:
    """Jobs from the Alibaba v2023 pod list (read it from ``../shared/data``; never copied).

    Arrival = ``creation_time`` (s); duration = ``deletion_time - creation_time`` (s), used as
    the solo time on every catalogue GPU model (the trace does not say which model a pod got)
    and as the CPU time of GPU-less pods. ``num_gpu`` GPUs; ``gpu_milli`` < 1000 (with
    ``num_gpu`` = 1) is a fractional, shared GPU: ``params["gpu_fraction"]`` = gpu_milli/1000.
    CPUs = ceil(cpu_milli / 1000). Pods with a non-positive duration are skipped.
    """
    jobs: list[JobSpec] = []
    for line, row in csv_rows(path, ALIBABA_COLUMNS):
        loc: Loc = {"file": path, "line": line}
        created = to_float(
            row["creation_time"], field="creation_time", minimum=0, maximum=MAX_SECONDS, **loc
        )
        deleted = to_float(
            row["deletion_time"], field="deletion_time", minimum=0, maximum=MAX_SECONDS, **loc
        )
        assert created is not None and deleted is not None
        duration = deleted - created
        if duration <= 0:
            continue
        gpus = to_int(row["num_gpu"], field="num_gpu", minimum=0, maximum=MAX_JOB_GPUS, **loc)
        milli = to_float(row["gpu_milli"], field="gpu_milli", minimum=0, maximum=1e6, **loc)
        cpu_milli = to_float(
            row["cpu_milli"], field="cpu_milli", minimum=0, maximum=1e3 * MAX_JOB_GPUS, **loc
        )
        params: dict[str, Any] = {"qos": row.get("qos", ""), "pod_phase": row.get("pod_phase", "")}
        if gpus == 1 and 0 < milli < 1000:
            params["gpu_fraction"] = milli / 1000.0
        if row.get("gpu_spec"):
            params["gpu_spec"] = row["gpu_spec"]
        profile = Profile(
            name=row["name"],
            cpu_time_s=duration,
            gpu_time_s=dict.fromkeys(CATALOG, duration) if gpus else {},
        )
        jobs.append(
            JobSpec(
                id=row["name"],
                name=row["name"],
                arrival_s=created,
                gpus=gpus,
                cpus=max(1, -(-int(cpu_milli) // 1000)),
                memory_mb=to_float(
                    row.get("memory_mib") or 0, field="memory_mib", minimum=0, maximum=MAX_MB, **loc
                ),
                profile=profile,
                params=params,
            )
        )
        if limit is not None and len(jobs) >= limit:
            break
    return _by_arrival(jobs)


# --------------------------------------------------------------------------------------------
# Any trace


TRACE_FORMATS = ("gavel", "profile", "alibaba")


def detect_trace_format(path: str | Path) -> str:
    """``gavel``, ``profile`` or ``alibaba`` from the CSV header; InputError if none fits."""
    header = set(csv_header(path))
    if set(GAVEL_COLUMNS) <= header:
        return "gavel"
    if set(PROFILE_TRACE_COLUMNS) <= header:
        return "profile"
    if set(ALIBABA_COLUMNS) <= header:
        return "alibaba"
    raise InputError(
        "not a known trace format; a Gavel trace needs "
        f"{', '.join(GAVEL_COLUMNS)}; a profile trace needs {', '.join(PROFILE_TRACE_COLUMNS)}",
        file=path,
        line=1,
    )


def read_trace(
    path: str | Path,
    *,
    fmt: str | None = None,
    profiles: Mapping[str, Profile] | str | Path | None = None,
    limit: int | None = None,
) -> list[JobSpec]:
    """Read a trace of any supported format (detected from the header unless ``fmt``).

    A profile trace without ``profiles`` looks for ``<trace stem>.profiles.yaml`` next to it.
    """
    fmt = fmt or detect_trace_format(path)
    if fmt == "gavel":
        jobs = read_gavel_trace(path)
    elif fmt == "alibaba":
        return read_alibaba_pods(path, limit=limit)
    elif fmt == "profile":
        if profiles is None:
            guess = Path(path).with_suffix(".profiles.yaml")
            if not guess.exists():
                raise InputError(
                    f"a profile trace needs a profiles file (--profiles); {guess.name} not found",
                    file=path,
                )
            profiles = guess
        jobs = read_profile_trace(path, profiles)
    else:
        raise InputError(
            f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS)}", file=path
        )
    return jobs[:limit] if limit is not None else jobs


def _by_arrival(jobs: list[JobSpec]) -> list[JobSpec]:
    return sorted(jobs, key=lambda j: j.arrival_s)  # stable: file order among equal times


# --------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scheduler.traces generate ...``: write a synthetic Gavel-format trace
    (``scheduler.trace_generator``); ``describe FILE``: summarise a trace. Bad arguments print
    one line and exit with status 2."""
    import argparse
    import sys

    from scheduler import trace_generator as gen

    parser = argparse.ArgumentParser(prog="python -m scheduler.traces")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser(
        "generate",
        help="a synthetic trace drawn with Gavel's generator settings (docs/simulator.md)",
    )
    g.add_argument("--jobs", type=int, required=True, help="number of jobs")
    g.add_argument(
        "--multi-gpu",
        action="store_true",
        help="draw scale factors 1/2/4/8 at 70/10/15/5 %% (else every job has 1 GPU)",
    )
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument(
        "--jobs-per-hour",
        type=float,
        default=0.5,
        help="mean arrival rate of the Poisson arrivals (default 0.5)",
    )
    g.add_argument("--burst", action="store_true", help="every job arrives at t=0")
    g.add_argument(
        "--duration-hours",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="V100 run times log-uniform between LOW and HIGH hours (default: Gavel's "
        "Philly-derived mix)",
    )
    g.add_argument("--out", required=True, help="the CSV file to write")
    d = sub.add_parser("describe", help="jobs, GPUs per job and span of a trace")
    d.add_argument("trace")
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            jobs = gen.generate_jobs(
                args.jobs,
                multi_gpu=args.multi_gpu,
                seed=args.seed,
                jobs_per_hour=args.jobs_per_hour,
                burst=args.burst,
                duration_hours=tuple(args.duration_hours) if args.duration_hours else None,
            )
            gen.write_gavel_trace(jobs, args.out)
            print(f"wrote {args.out}: {gen.describe(jobs)}")
            return 0
        specs = read_trace(args.trace)
        sizes: dict[int, int] = {}
        for job in specs:
            sizes[job.gpus] = sizes.get(job.gpus, 0) + 1
        span = (specs[-1].arrival_s - specs[0].arrival_s) / 86400 if specs else 0.0
        mix = ", ".join(f"{n} x {s} GPU" for s, n in sorted(sizes.items()))
        print(f"{args.trace}: {len(specs)} jobs ({mix}), arrivals over {span:.1f} days")
        return 0
    except (InputError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
