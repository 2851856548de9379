"""``manage.py load_demo``: seed profiles, users, a virtual cluster, policy and scenario jobs;
running it twice changes nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from portal.core.adapters import derived_classes
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    JobEvent,
    Node,
    PolicySettings,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from scheduler.policies.registry import build_policy

pytestmark = pytest.mark.django_db


def load(*args: str) -> str:
    out = StringIO()
    call_command("load_demo", *args, stdout=out)
    return out.getvalue()


def snapshot() -> dict[str, object]:
    return {
        "profiles": sorted(
            ApplicationProfile.objects.values_list("name", "version", "status", "updated_at")
        ),
        "gpu_times": sorted(ProfileGpuTime.objects.values_list("profile__name", "time_s")),
        "steps": sorted(ProfileMemoryStep.objects.values_list("profile__name", "index", "to_mb")),
        "users": sorted(get_user_model().objects.values_list("username", "password")),
        "nodes": sorted(Node.objects.values_list("name", "kind", "backend")),
        "gpus": sorted(Gpu.objects.values_list("node__name", "index", "model")),
        "policy": list(PolicySettings.objects.values_list("name", "policy", "active")),
        "jobs": sorted(Job.objects.values_list("id", "name", "state")),
        "events": JobEvent.objects.count(),
    }


def test_load_demo_is_idempotent():
    output = load()
    first = snapshot()
    second_output = load()
    assert snapshot() == first
    assert "Jobs: 25 created" in output and "Jobs: 0 created" in second_output
    assert "Profiles: 0 created" in second_output


def test_it_prints_the_credentials_and_a_warning():
    output = load()
    assert "demo / demo-pass-123" in output
    assert "admin / admin-pass-123" in output
    assert "WARNING" in output and "changepassword admin" in output


def test_users():
    load()
    users = get_user_model().objects
    demo, admin = users.get(username="demo"), users.get(username="admin")
    assert demo.check_password("demo-pass-123") and not demo.is_staff
    assert admin.check_password("admin-pass-123") and admin.is_superuser and admin.is_staff


def test_seed_profiles_are_approved():
    load("--no-jobs")
    profiles = ApplicationProfile.objects.all()
    assert {p.status for p in profiles} == {"approved"}
    assert all(p.approved_by.username == "admin" for p in profiles)
    names = set(profiles.values_list("name", flat=True))
    assert {"CNN-MNIST", "BlackScholes", "Binomial", "LAMMPS", "GROMACS"} <= names  # 004
    assert {"LavaMD", "SPMV", "Convolution-3D", "Syr2k"} <= names  # 003 Table 7
    assert {"ResNet50-inference", "YOLOv5-train"} <= names  # 001 Table 3
    assert len(names) == 5 + 18 - 1 + 10  # BlackScholes is in 004 and 003: one profile


def test_lammps_has_the_published_memory_steps():
    load("--no-jobs")
    lammps = ApplicationProfile.objects.get(name="LAMMPS")
    assert [(s.from_mb, s.to_mb) for s in lammps.memory_steps.all()] == [
        (0, 833),
        (833, 1895),
        (1895, 2795),
        (2795, 8317),
    ]
    assert lammps.cpu_time_s == 990
    assert lammps.gpu_times.get(gpu_model="TitanXp").time_s == 85
    # Table 2's 2,273 MB contradicts these steps: the profile declares their peak, and says why
    assert lammps.gpu_memory_max_mb == 8317
    assert "Table 2 says 2,273 MB" in lammps.sources["gpu_memory_max_mb"]


def test_every_demo_profile_declares_a_maximum_covering_its_steps():
    load("--no-jobs")
    stepped = []
    for profile in ApplicationProfile.objects.prefetch_related("memory_steps"):
        peaks = [s.to_mb for s in profile.memory_steps.all()]
        if peaks:
            stepped.append(profile.name)
            assert profile.gpu_memory_max_mb >= max(peaks), profile.name
    # The seeds do declare steps (without them the loop above checks nothing).
    assert {"Binomial", "BlackScholes", "CNN-MNIST", "GROMACS", "LAMMPS"} <= set(stepped)


def test_profiles_are_filled_in_and_say_where_each_number_comes_from():
    """Issue 18: 26 of 32 demo profiles had no run time; now every one has a time on both GPU
    models of the demo cluster, and a source for every number the seeds do not give."""
    load("--no-jobs")
    profiles = list(ApplicationProfile.objects.prefetch_related("gpu_times"))
    assert len(profiles) == 32
    for profile in profiles:
        models = {t.gpu_model for t in profile.gpu_times.all()}
        assert {"TitanXp", "A30"} <= models, profile.name
        for model in models:
            assert profile.sources.get(f"gpu_time_s.{model}"), (profile.name, model)
        assert all(t.time_s > 0 for t in profile.gpu_times.all())
    cnn = ApplicationProfile.objects.get(name="CNN-MNIST")
    assert cnn.sources["gpu_time_s.TitanXp"] == "seed 004 Table 2 (measured on a Titan Xp)"
    assert "estimated from the TitanXp time" in cnn.sources["gpu_time_s.A30"]
    # an estimate by the catalogue: memory-bound BlackScholes gains the bandwidth ratio
    bs = ApplicationProfile.objects.get(name="BlackScholes")
    assert bs.gpu_times.get(gpu_model="A30").time_s == pytest.approx(21 * 547.6 / 933, rel=0.01)
    # measured data where it exists: Gavel's nvprof runs of ResNet-50 at batch 16 (V100)
    resnet = ApplicationProfile.objects.get(name="ResNet50-train")
    assert resnet.sm_efficiency_pct == pytest.approx(76.17, abs=0.01)
    assert "Gavel nvprof_summary.csv (resnet50_16)" in resnet.sources["sm_efficiency_pct"]
    assert resnet.sources["cm_ratio"] == "seed 001 Table 3 (measured)"
    # kernels: the published stall reasons, and the kernel model's figures named as a model
    lbm = ApplicationProfile.objects.get(name="LBM")
    assert lbm.sources["stall_texture_pct"] == "seed 003 Table 7 (measured with nvprof)"
    assert "a model, not a measurement" in lbm.sources["saturation_tbs_per_sm"]


def test_the_profile_page_shows_the_sources(client):
    load("--no-jobs")
    client.login(username="demo", password="demo-pass-123")
    lammps = ApplicationProfile.objects.get(name="LAMMPS")
    html = client.get(f"/profiles/{lammps.pk}/").content.decode()
    assert 'id="sources"' in html
    assert "GPU time, A30" in html and "estimated from the TitanXp time" in html
    assert "Table 2 says 2,273 MB" in html


def test_an_older_demo_profile_without_sources_is_filled_in():
    load("--no-jobs")
    ApplicationProfile.objects.filter(name="CNN-MNIST").update(sources={})
    ProfileGpuTime.objects.filter(profile__name="CNN-MNIST", gpu_model="A30").delete()
    load("--no-jobs")
    cnn = ApplicationProfile.objects.get(name="CNN-MNIST")
    assert cnn.sources and cnn.gpu_times.filter(gpu_model="A30").exists()
    assert cnn.status == "approved"


def test_blackscholes_merges_004_times_and_003_stalls():
    load("--no-jobs")
    bs = ApplicationProfile.objects.get(name="BlackScholes")
    assert bs.cpu_time_s == 324 and bs.stall_memory_dependency_pct == 73.81
    assert bs.dram_bw_gbps == 266.0


def test_table7_kernels_get_their_published_class():
    """The profiles carry what scheduler.classes needs to reproduce Table 7's types."""
    import csv

    from portal.core.management.commands.load_demo import SEEDS

    load("--no-jobs")
    with (SEEDS / "003_kernels_table7.csv").open() as f:
        for row in csv.DictReader(f):
            profile = ApplicationProfile.objects.get(name=row["name"])
            assert derived_classes(profile)["kernel_class"] == row["type"], row["name"]


def test_cm_ratio_models():
    load("--no-jobs")
    resnet = ApplicationProfile.objects.get(name="ResNet50-inference")
    assert (resnet.kind, resnet.cm_ratio) == ("dl-infer", 18.49)
    assert derived_classes(resnet)["cm_class"] == "C"
    assert derived_classes(ApplicationProfile.objects.get(name="VGG16-train"))["cm_class"] == "M"


def test_virtual_cluster_from_the_catalogue():
    load("--no-jobs")
    nodes = {n.name: n for n in Node.objects.all()}
    assert {n.backend for n in nodes.values()} == {"virtual"}
    assert sorted(n.kind for n in nodes.values()) == ["cpu", "gpu", "gpu"]
    models = set(Gpu.objects.values_list("model", flat=True))
    assert models == {"TitanXp", "A30"}
    a30 = Gpu.objects.filter(model="A30").first()
    assert a30.memory_mb == 24576 and a30.sm_count == 56
    assert "mig" in a30.sharing_modes
    assert [p["name"] for p in a30.mig_profiles] == ["1g.6gb", "2g.12gb", "4g.24gb"]
    assert "mig" not in Gpu.objects.filter(model="TitanXp").first().sharing_modes


def test_default_policy_is_seed004s_rate_split_with_the_memory_plan():
    load("--no-jobs")
    active = PolicySettings.objects.get(active=True)
    assert active.policy == "placement_rate+exec_plan"
    assert active.params == {"placement_params": {"max_jobs_per_gpu": 5}}
    # The stored configuration builds (the live loop would fail every cycle otherwise).
    assert build_policy(active.policy, active.params).name == "placement_rate+exec_plan"


def test_an_operators_policy_is_left_alone():
    PolicySettings.objects.create(name="ours", policy="binpack", active=True)
    load("--no-jobs")
    assert list(PolicySettings.objects.values_list("policy", "active")) == [("binpack", True)]


def test_scenario_jobs_for_the_demo_user():
    load()
    jobs = Job.objects.filter(owner__username="demo")
    assert jobs.count() == 25
    counts = {
        app: jobs.filter(profile__name=app).count()
        for app in ("CNN-MNIST", "BlackScholes", "Binomial", "LAMMPS", "GROMACS")
    }
    assert counts == {"CNN-MNIST": 13, "BlackScholes": 5, "Binomial": 5, "LAMMPS": 1, "GROMACS": 1}
    lammps = jobs.get(profile__name="LAMMPS")
    assert lammps.command == "python -m workers.emulate --profile LAMMPS"
    assert lammps.state == "PENDING" and lammps.kind == "hpc"


def test_no_jobs_flag_and_a_later_run_with_jobs():
    load("--no-jobs")
    assert Job.objects.count() == 0
    load("--emulate-scale", "0.05")
    assert Job.objects.count() == 25
    assert Job.objects.first().command.endswith("--scale 0.05")
    load()  # another scale later: still no duplicates
    assert Job.objects.count() == 25


def test_again_queues_a_new_round_each_time():
    load()
    load("--again", "--emulate-scale", "0.1")
    load("--again")
    assert Job.objects.count() == 75
    names = set(Job.objects.filter(profile__name="LAMMPS").values_list("name", flat=True))
    assert names == {"LAMMPS-1", "LAMMPS-1-r2", "LAMMPS-1-r3"}
    assert Job.objects.get(name="CNN-MNIST-13-r2").command.endswith("--scale 0.1")
