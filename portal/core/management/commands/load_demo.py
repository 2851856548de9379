"""``python manage.py load_demo``: the embedded demo's data, idempotent (a second run changes
nothing).

- Approved profiles from the seeds' tables (``scheduler/data/seeds/``): the 004 profiles (Table 2)
  with the LAMMPS memory steps, the 003 Table 7 kernels (stall reasons, EPC, registers and shared
  memory per block) as HPC profiles, the 001 Table 3 models with their C/M ratios.
- A demo user and an administrator (printed; change the administrator's password).
- A small virtual cluster: two GPU nodes of different catalogue models (Titan Xp as in the seeds;
  A30 for MIG) and one CPU node, all with ``backend=virtual``.
- The active policy, if none is set: ``placement_rate+exec_plan`` (seed 004, ALGORITHMS.md §1)
  with up to 5 jobs per GPU, as the paper's 5 GPU containers; and, unless ``--no-jobs``, the 004
  scenario's 25 jobs for the demo user (13 CNN-MNIST, 5 BlackScholes, 5 Binomial, 1 LAMMPS,
  1 GROMACS), submitted with idempotency keys so they are created once. So the demo shows the
  rate split (CNNs and LAMMPS on the GPUs, the rest on the CPU node) and the memory plan pausing
  LAMMPS before its 8.3 GB step would overflow a shared Titan Xp.
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


def seed_profile_records() -> list[ProfileRecord]:
    """The seeds' tables as profile records (one per application; BlackScholes appears in 004
    and 003 and gets one profile with the run times of the first and the stalls of the second)."""
    records: dict[str, ProfileRecord] = {}

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
        steps = steps_by_app.get(app) or [(0.0, 0.0, mem_max)]
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
                "gpu_memory_max_mb": mem_max,
                "gpu_memory_avg_mb": (mem_min + mem_max) / 2,
            },
            gpu_times={SEED_GPU: float(r["gpu_exec_time_s"])},
            memory_steps=steps,
        )

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
            **_DEMANDS_003.get(r["app"], {}),
        }
        if r["app"] in _SATURATION_003:
            stalls["saturation_tbs_per_sm"] = _SATURATION_003[r["app"]]
        existing = records.get(r["name"])
        if existing is not None:
            existing.fields.update(stalls)
            existing.fields["description"] += f" Stall reasons: seed 003 Table 7 ({r['app']})."
            continue
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
            },
        )

    for r in _rows("001_cm_ratio_table3.csv"):
        mode = r["mode"]
        name = f"{r['model']}-{'train' if mode == 'train' else 'inference'}"
        records[name] = ProfileRecord(
            row=None,
            fields={
                "name": name,
                "version": "1",
                "kind": "dl-train" if mode == "train" else "dl-infer",
                "description": f"Seed 001 Table 3: C/M ratio {r['cm_ratio']} ({r['class']}).",
                "cm_ratio": float(r["cm_ratio"]),
            },
        )
    return list(records.values())


def scenario_004() -> list[tuple[str, int]]:
    """The 004 workload: (application, count) from Table 2 (25 jobs)."""
    return [(r["app"], int(r["count_in_workload"])) for r in _rows("004_profiles_table2.csv")]


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
            f"Profiles: {created_profiles} created ({ApplicationProfile.objects.count()} in all). "
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
            if ApplicationProfile.objects.filter(name=name, version=version).exists():
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
                    cpus=1,
                    params={"scenario": "004"},
                )
                created += was_created
        return created
