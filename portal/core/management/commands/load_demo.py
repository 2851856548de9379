"""``python manage.py load_demo``: the embedded demo's data, idempotent (a second run changes
nothing).

- Approved profiles from the seeds' tables (``scheduler/data/seeds/``): the 004 profiles (Table 2)
  with the LAMMPS memory steps, the 003 Table 7 kernels (stall reasons, EPC, registers and shared
  memory per block) as HPC profiles, the 001 Table 3 models with their C/M ratios; filled in from
  measured data where it exists (Gavel's nvprof runs of ResNet-50 and VGG16) and otherwise from
  the simulator's documented scenario profiles (sharing001's assumed times and memory, the kernel
  model of kscheduler003), with every number's source in ``ApplicationProfile.sources`` (the
  profile page shows them). A30 times that nobody measured are estimated from the Titan Xp time
  (``scheduler.gpu_estimates``), so the A30 node gets jobs. A declared GPU memory maximum covers the
  memory steps (LAMMPS: 8,317 MB, not Table 2's 2,273 MB; profile validation enforces it).
- A demo user and an administrator (printed; change the administrator's password).
- A small virtual cluster: two GPU nodes of different catalogue models (Titan Xp as in the seeds;
  A30 for MIG) and one CPU node, all with ``backend=virtual``.
- The active policy, if none is set: ``placement_rate+exec_plan`` (seed 004, docs: Policies)
  with up to 5 jobs per GPU, as the paper's 5 GPU containers; and, unless ``--no-jobs``, the 004
  scenario's 25 jobs for the demo user (13 CNN-MNIST, 5 BlackScholes, 5 Binomial, 1 LAMMPS,
  1 GROMACS), each declaring Table 2's GPU memory as in the paper (LAMMPS 2,273 MB, below its
  own steps: the memory plan's case), submitted with idempotency keys so they are created once.
  With four GPUs the rate split puts nearly all of them on the GPUs; ``run_embedded
  --arrivals-per-minute`` (``portal.core.demo``) keeps jobs coming afterwards.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

import scheduler
from portal.core import services
from portal.core.importers import ProfileRecord
from portal.core.models import ApplicationProfile, Gpu, Job, Node, PolicySettings
from scheduler.catalog import gpu_spec
from scheduler.gpu_estimates import estimate_gpu_time

SEEDS = Path(scheduler.__file__).resolve().parent / "data" / "seeds"

DEMO_USER = ("demo", "demo-pass-123")
ADMIN_USER = ("admin", "admin-pass-123")
SEED_GPU = "TitanXp"  # the seeds' testbeds (004, 003) ran on Titan Xp
# The demo's policy: seed 004's rate split and memory plan, 5 containers per GPU as in the paper.
DEMO_POLICY = "placement_rate+exec_plan"
DEMO_POLICY_PARAMS = {"placement_params": {"max_jobs_per_gpu": 5}}

# name, kind, cores, memory MB, GPU model, GPU count
CLUSTER = [
    ("gpu-titanxp-1", Node.Kind.GPU, 16, 65536, "TitanXp", 2),
    ("gpu-a30-1", Node.Kind.GPU, 32, 131072, "A30", 2),
    ("cpu-1", Node.Kind.CPU, 32, 131072, None, 0),
]
# 004 Table 2 applications that are HPC codes (the others are DL training)
_KIND_004 = {"CNN-MNIST": "dl-train"}
# 003 Table 7 (ALGORITHMS.md §3): demands and saturation points given in the text
_DEMANDS_003 = {"BS": {"dram_bw_gbps": 266.0}, "LM": {"gflops": 200.26}}
_SATURATION_003 = {"SPMV": 4, "STENCIL": 12, "LM": 2, "CUTCP": 10}


def _rows(name: str) -> list[dict[str, str]]:
    with (SEEDS / name).open(newline="") as f:
        return list(csv.DictReader(f))


# Where the numbers come from (``ApplicationProfile.sources``; shown on the profile page).
SRC_004 = "seed 004 Table 2 (measured on a Titan Xp)"
SRC_004_STEPS = (
    "seed 004 section 5.2 (measured ranges); where each step begins is not published: "
    "assumed equal quarters of the run"
)
SRC_003 = "seed 003 Table 7 (measured with nvprof)"
SRC_003_TEXT = "seed 003, the text next to Table 7"
SRC_KERNEL_MODEL = (
    "the kernel model of scheduler/kernels.py behind the kscheduler003 scenario "
    "(scheduler/scenarios/profiles/kscheduler003.yaml): a model, not a measurement"
)
SRC_001 = "seed 001 Table 3 (measured)"
SRC_SHARING001 = (
    "the sharing001 scenario's {name} (scheduler/scenarios/profiles/sharing001.yaml): "
    "assumed, the paper gives no times or memory"
)
SRC_GAVEL_NVPROF = (
    "Gavel nvprof_summary.csv ({row}): TensorFlow 1.12 training, batch size {batch}, "
    "measured on a V100"
)
SCENARIO_PROFILES = Path(scheduler.__file__).resolve().parent / "scenarios" / "profiles"
GAVEL = Path(scheduler.__file__).resolve().parent / "data" / "gavel"
# The GPU models of the demo cluster that have no measured time get an estimate
# (scheduler.gpu_estimates) from the seeds' Titan Xp time.
ESTIMATED_MODELS = ("A30",)
# Seed 001's models measured by Gavel's nvprof runs, at the medium size's batch (16).
_GAVEL_NVPROF_001 = {"ResNet50-train": "resnet50_16", "VGG16-train": "vgg16_16"}
# Seed 001's size the demo profiles take from the sharing001 scenario (small / medium / big).
_SIZE_001 = "medium"


def _kernel_class_of(fields: dict[str, Any]) -> str | None:
    """The §3 kernel class of a record's stall reasons (None without them)."""
    from scheduler.classes import kernel_class
    from scheduler.domain import Profile, StallReasons

    if "stall_memory_dependency_pct" not in fields:
        return None
    stall = StallReasons(
        exec_dependency=fields["stall_exec_dependency_pct"],
        instruction_fetch=fields["stall_instruction_fetch_pct"],
        memory_dependency=fields["stall_memory_dependency_pct"],
        texture=fields["stall_texture_pct"],
        synchronization=fields["stall_synchronization_pct"],
        other=fields["stall_other_pct"],
    )
    return kernel_class(Profile(name="k", stall=stall))


def _add_estimates(record: ProfileRecord, sources: dict[str, str]) -> None:
    """A30 (``ESTIMATED_MODELS``) times estimated from the Titan Xp time where none is given."""
    times = record.gpu_times or {}
    if SEED_GPU not in times:
        return
    klass = _kernel_class_of(record.fields)
    for model in ESTIMATED_MODELS:
        if model not in times:
            times[model], sources[f"gpu_time_s.{model}"] = estimate_gpu_time(
                times[SEED_GPU], SEED_GPU, model, klass
            )
    record.gpu_times = times


def _gavel_nvprof() -> dict[str, dict[str, str]]:
    with (GAVEL / "nvprof_summary.csv").open(newline="") as f:
        return {
            r["model_dir"]: r for r in csv.DictReader(f) if r["profile_set"] == "v100_2019-02-01"
        }


def seed_profile_records() -> list[ProfileRecord]:
    """The seeds' tables as profile records (one per application; BlackScholes appears in 004
    and 003 and gets one profile with the run times of the first and the stalls of the second),
    filled in from the measured data where it exists and from the simulator's documented
    scenario profiles (their assumptions named) where it does not; every number's source is in
    the record's ``sources``. A30 times are estimates (``scheduler.gpu_estimates``)."""
    from scheduler.traces import load_profiles

    records: dict[str, ProfileRecord] = {}
    sources: dict[str, dict[str, str]] = {}

    steps_by_app: dict[str, list[tuple[float, float, float]]] = {}
    step_rows = _rows("004_lammps_memory_steps.csv")
    for app in {r["app"] for r in step_rows}:
        rows = sorted((r for r in step_rows if r["app"] == app), key=lambda r: int(r["step"]))
        # The paper gives the ranges, not when each step begins: spread them evenly over the run.
        steps_by_app[app] = [
            (i / len(rows), float(r["gpu_memory_mb_from"]), float(r["gpu_memory_mb_to"]))
            for i, r in enumerate(rows)
        ]
    for r in _rows("004_profiles_table2.csv"):
        app = r["app"]
        mem_min, mem_max = float(r["gpu_memory_mb_min"]), float(r["gpu_memory_mb_max"])
        steps = steps_by_app.get(app)
        src = {
            "cpu_time_s": SRC_004,
            f"gpu_time_s.{SEED_GPU}": SRC_004,
            "gpu_memory_avg_mb": f"{SRC_004}: the middle of its range",
            "gpu_memory_max_mb": SRC_004,
        }
        declared = mem_max
        if steps:
            src["memory_steps"] = SRC_004_STEPS
            peak = max(hi for _s, _lo, hi in steps)
            if peak > mem_max:
                # Table 2's maximum contradicts the steps: a job asking for it would be short.
                declared = peak
                src["gpu_memory_max_mb"] = (
                    f"the peak of its memory steps (seed 004 section 5.2); Table 2 says "
                    f"{mem_max:,.0f} MB, below the steps it publishes"
                )
        else:
            steps = [(0.0, 0.0, mem_max)]
            src["memory_steps"] = f"{SRC_004}: one step up to its maximum"
        records[app] = ProfileRecord(
            row=None,
            fields={
                "name": app,
                "version": "1",
                "kind": _KIND_004.get(app, "hpc"),
                "description": (
                    f"Seed 004 Table 2 ({SEED_GPU}): {r['steps']} memory step(s), "
                    f"published placement rate {r['published_rate']} -> {r['published_node']}."
                ),
                "cpu_time_s": float(r["cpu_exec_time_s"]),
                "gpu_memory_max_mb": declared,
                "gpu_memory_avg_mb": (mem_min + mem_max) / 2,
            },
            gpu_times={SEED_GPU: float(r["gpu_exec_time_s"])},
            memory_steps=steps,
        )
        sources[app] = src

    kernel_model = load_profiles(SCENARIO_PROFILES / "kscheduler003.yaml")
    for r in _rows("003_kernels_table7.csv"):
        stalls: dict[str, Any] = {
            "stall_exec_dependency_pct": float(r["exec_dependency_pct"]),
            "stall_instruction_fetch_pct": float(r["instruction_fetch_pct"]),
            "stall_memory_dependency_pct": float(r["memory_dependency_pct"]),
            "stall_other_pct": float(r["others_pct"]),
            "stall_synchronization_pct": float(r["synchronization_pct"]),
            "stall_texture_pct": float(r["texture_pct"]),
            "epc": float(r["eligible_warps_per_cycle"]),
            "registers_per_block": int(r["registers_per_block"]),
            "smem_per_block_bytes": int(r["smem_per_block_bytes"]),
        }
        src = dict.fromkeys(stalls, SRC_003)
        for key, value in _DEMANDS_003.get(r["app"], {}).items():
            stalls[key], src[key] = value, SRC_003_TEXT
        if r["app"] in _SATURATION_003:
            stalls["saturation_tbs_per_sm"] = _SATURATION_003[r["app"]]
            src["saturation_tbs_per_sm"] = SRC_003_TEXT
        model = kernel_model.get(r["app"])
        modelled: dict[str, Any] = {}
        if model is not None:
            for key in ("saturation_tbs_per_sm", "dram_bw_gbps", "l1_transactions"):
                value = getattr(model, key)
                if value is not None and key not in stalls:
                    modelled[key] = value
        existing = records.get(r["name"])
        if existing is not None:  # BlackScholes: 004's application, 003's kernel
            existing.fields.update(stalls)
            existing.fields.update(modelled)
            existing.fields["description"] += f" Stall reasons: seed 003 Table 7 ({r['app']})."
            sources[r["name"]].update(src)
            sources[r["name"]].update(dict.fromkeys(modelled, SRC_KERNEL_MODEL))
            continue
        gpu_times = None
        if model is not None:
            modelled["gpu_memory_max_mb"] = model.gpu_memory_max_mb
            gpu_times = dict(model.gpu_time_s)
            src.update(dict.fromkeys(modelled, SRC_KERNEL_MODEL))
            src.update({f"gpu_time_s.{m}": SRC_KERNEL_MODEL for m in gpu_times})
        records[r["name"]] = ProfileRecord(
            row=None,
            fields={
                "name": r["name"],
                "version": "1",
                "kind": "hpc",
                "description": (
                    f"Seed 003 Table 7 kernel {r['app']} ({r['source_suite']}), published "
                    f"type {r['type']}."
                ),
                **stalls,
                **modelled,
            },
            gpu_times=gpu_times,
        )
        sources[r["name"]] = src

    sharing = load_profiles(SCENARIO_PROFILES / "sharing001.yaml")
    nvprof = _gavel_nvprof()
    for r in _rows("001_cm_ratio_table3.csv"):
        mode = r["mode"]
        name = f"{r['model']}-{'train' if mode == 'train' else 'inference'}"
        fields: dict[str, Any] = {
            "name": name,
            "version": "1",
            "kind": "dl-train" if mode == "train" else "dl-infer",
            "description": f"Seed 001 Table 3: C/M ratio {r['cm_ratio']} ({r['class']}).",
            "cm_ratio": float(r["cm_ratio"]),
        }
        src = {"cm_ratio": SRC_001}
        gpu_times = None
        assumed = sharing.get(f"{name}-{_SIZE_001}")
        if assumed is not None:
            note = SRC_SHARING001.format(name=assumed.name)
            gpu_times = dict(assumed.gpu_time_s)
            src.update({f"gpu_time_s.{m}": note for m in gpu_times})
            for key in ("gpu_memory_max_mb", "sensitivity", "batch_size", "image_size"):
                value = getattr(assumed, key)
                if value is not None:
                    fields[key], src[key] = value, note
        measured = nvprof.get(_GAVEL_NVPROF_001.get(name, ""))
        if measured is not None:
            note = SRC_GAVEL_NVPROF.format(row=measured["model_dir"], batch=measured["batch_size"])
            for key, column in (
                ("sm_efficiency_pct", "sm_efficiency"),
                ("epc", "eligible_warps_per_cycle"),
                ("ipc", "ipc"),
                ("warp_efficiency_pct", "warp_execution_efficiency"),
            ):
                if measured[column]:
                    fields[key], src[key] = round(float(measured[column]), 2), note
            dram = [measured[c] for c in ("dram_read_throughput", "dram_write_throughput")]
            if all(dram):
                fields["dram_bw_gbps"] = round(sum(float(v) for v in dram), 1)
                src["dram_bw_gbps"] = f"{note} (read + write)"
        records[name] = ProfileRecord(row=None, fields=fields, gpu_times=gpu_times)
        sources[name] = src

    for name, record in records.items():
        _add_estimates(record, sources[name])
        record.fields["sources"] = dict(sorted(sources[name].items()))
    return list(records.values())


def scenario_004() -> list[tuple[str, int]]:
    """The 004 workload: (application, count) from Table 2 (25 jobs)."""
    return [(r["app"], int(r["count_in_workload"])) for r in _rows("004_profiles_table2.csv")]


def declared_memory_004() -> dict[str, int]:
    """The GPU memory each 004 job declares: Table 2's maximum, as in the paper. For LAMMPS
    that is 2,273 MB while its steps climb to 8,317 MB (the profile declares the peak): the
    job asks too little, which is the situation the memory plan exists for."""
    return {r["app"]: int(float(r["gpu_memory_mb_max"])) for r in _rows("004_profiles_table2.csv")}


class Command(BaseCommand):
    help = "Load the demo: seed profiles, demo and admin users, a virtual cluster, scenario jobs."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-jobs", action="store_true", help="do not submit demo jobs")
        parser.add_argument(
            "--emulate-scale",
            type=float,
            default=None,
            help="append --scale X to the jobs' emulator command (e.g. 0.05 for a quick demo)",
        )
        parser.add_argument(
            "--again",
            action="store_true",
            help="queue the scenario's jobs once more (a new round; without it they are "
            "submitted only once)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            demo, admin_user = self._users()
            created_profiles = self._profiles(admin_user)
            created_nodes = self._cluster()
            policy, policy_created = PolicySettings.objects.get_or_create(
                active=True,
                defaults={"name": "default", "policy": DEMO_POLICY, "params": DEMO_POLICY_PARAMS},
            )
        jobs_created = 0
        if not options["no_jobs"]:
            jobs_created = self._jobs(demo, options["emulate_scale"], options["again"])
        self.stdout.write(
            f"Profiles: {created_profiles} created or filled in "
            f"({ApplicationProfile.objects.count()} in all). "
            f"Nodes: {created_nodes} created. Policy: {policy.policy}"
            f"{' (created)' if policy_created else ''}. Jobs: {jobs_created} created."
        )
        self.stdout.write(f"Demo user:      {DEMO_USER[0]} / {DEMO_USER[1]}")
        self.stdout.write(f"Administrator:  {ADMIN_USER[0]} / {ADMIN_USER[1]}")
        self.stdout.write(
            self.style.WARNING(
                "WARNING: these are well-known demo passwords. Change the administrator's "
                "password (python manage.py changepassword admin) before exposing this server."
            )
        )

    def _profiles(self, admin_user: Any) -> int:
        created = 0
        for record in seed_profile_records():
            name, version = record.key
            existing = ApplicationProfile.objects.filter(name=name, version=version).first()
            if existing is not None:
                if not existing.sources and existing.created_by_id == admin_user.pk:
                    # written by an older load_demo (no sources): fill it in, keep its status
                    services.profile_save(record, actor=admin_user, profile=existing)
                    created += 1
                continue
            profile = services.profile_save(
                record, actor=admin_user, source=ApplicationProfile.Source.MANUAL
            )
            services.profile_approve(profile, actor=admin_user)
            created += 1
        return created

    def _users(self) -> tuple[Any, Any]:
        users = get_user_model()
        demo = users.objects.filter(username=DEMO_USER[0]).first()
        if demo is None:
            demo = users.objects.create_user(DEMO_USER[0], "demo@example.org", DEMO_USER[1])
        admin_user = users.objects.filter(username=ADMIN_USER[0]).first()
        if admin_user is None:
            admin_user = users.objects.create_superuser(
                ADMIN_USER[0], "admin@example.org", ADMIN_USER[1]
            )
        return demo, admin_user

    def _cluster(self) -> int:
        created = 0
        for name, kind, cores, memory_mb, model, count in CLUSTER:
            node, was_created = Node.objects.get_or_create(
                name=name,
                defaults={
                    "kind": kind,
                    "cores": cores,
                    "memory_mb": memory_mb,
                    "backend": "virtual",
                },
            )
            created += was_created
            if model is None:
                continue
            spec = gpu_spec(model)
            for index in range(count):
                Gpu.objects.get_or_create(
                    node=node,
                    index=index,
                    defaults={
                        "uuid": f"VIRTUAL-{name}-{index}",
                        "model": spec.model,
                        "architecture": spec.architecture,
                        "memory_mb": spec.memory_mb,
                        "sm_count": spec.sm_count,
                        "sharing_modes": [m.value for m in spec.sharing_modes],
                        "mig_profiles": [
                            {"name": p.name, "slices": p.compute_slices, "memory_mb": p.memory_mb}
                            for p in spec.mig_profiles
                        ],
                    },
                )
        return created

    def _jobs(self, demo: Any, scale: float | None, again: bool = False) -> int:
        created = 0
        suffix = f" --scale {scale:g}" if scale else ""
        # Round 1's keys are the first ones ever used; --again takes the first unused round.
        round_no = 1
        if again:
            round_no = 2
            while Job.objects.filter(
                owner=demo, idempotency_key__startswith=f"load_demo:004:r{round_no}:"
            ).exists():
                round_no += 1
        prefix = "load_demo:004:" if round_no == 1 else f"load_demo:004:r{round_no}:"
        tag = "" if round_no == 1 else f"-r{round_no}"
        declared = declared_memory_004()
        for app, count in scenario_004():
            profile = ApplicationProfile.objects.get(name=app, version="1")
            for i in range(1, count + 1):
                key = f"{prefix}{app}:{i}"
                if Job.objects.filter(owner=demo, idempotency_key=key).exists():
                    continue  # submitted by an earlier run (perhaps with another --emulate-scale)
                _job, was_created = services.job_submit(
                    demo,
                    idempotency_key=key,
                    name=f"{app}-{i}{tag}",
                    command=f"python -m workers.emulate --profile {app}{suffix}",
                    profile=profile,
                    gpus=1,
                    gpu_memory_mb=declared[app],
                    cpus=1,
                    # Seed 004 shares GPUs and sends jobs to the CPU node where its placement
                    # rate says so: the jobs declare both (docs/jobs.md).
                    sharing="allowed",
                    device="auto",
                    params={"scenario": "004"},
                )
                created += was_created
        return created
