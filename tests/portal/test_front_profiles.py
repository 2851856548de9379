"""Profiles list and detail pages."""

from __future__ import annotations

import pytest
from django.contrib import admin

from portal.core.models import ApplicationProfile, ProfileGpuTime, ProfileMemoryStep
from portal.front.views import PROFILES_PER_PAGE

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def lammps():
    profile = ApplicationProfile.objects.create(
        name="LAMMPS",
        kind="hpc",
        status="approved",
        cpu_time_s=990,
        gpu_memory_max_mb=2273,
        stall_memory_dependency_pct=78.18,
        stall_exec_dependency_pct=11.86,
        epc=2.32,
        sm_efficiency_pct=40.0,
        mem_util_pct=20.0,
        batch_size=16,
        image_size=224,
        sensitivity=1.3,
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="TitanXp", time_s=85)
    ProfileMemoryStep.objects.create(
        profile=profile, index=1, start_fraction=0.0, from_mb=0, to_mb=833
    )
    ProfileMemoryStep.objects.create(
        profile=profile, index=2, start_fraction=0.5, from_mb=833, to_mb=1895
    )
    return profile


def test_users_see_approved_profiles_only(alice_client, lammps):
    ApplicationProfile.objects.create(name="Draft-app", kind="hpc", status="draft")
    html = alice_client.get("/profiles/").content.decode()
    assert "LAMMPS" in html and "Draft-app" not in html
    assert "Curate in admin" not in html


def test_staff_see_all_profiles_and_filter_by_status(client, staff, lammps):
    ApplicationProfile.objects.create(name="Draft-app", kind="hpc", status="draft")
    client.force_login(staff)
    html = client.get("/profiles/").content.decode()
    assert "LAMMPS" in html and "Draft-app" in html
    drafts = client.get("/profiles/?status=draft").content.decode()
    assert "Draft-app" in drafts and "LAMMPS" not in drafts


def test_staff_get_a_link_to_curate_profiles_in_the_admin(client, staff, lammps):
    assert admin.site.is_registered(ApplicationProfile), "staff curate profiles in the admin"
    client.force_login(staff)
    assert "/admin/core/applicationprofile/" in client.get("/profiles/").content.decode()
    detail = client.get(f"/profiles/{lammps.pk}/").content.decode()
    assert f"/admin/core/applicationprofile/{lammps.pk}/change/" in detail


def test_filter_by_kind_and_search(alice_client, lammps):
    ApplicationProfile.objects.create(
        name="ResNet50", kind="dl-train", status="approved", dataset="ImageNet"
    )
    assert "LAMMPS" not in alice_client.get("/profiles/?kind=dl-train").content.decode()
    html = alice_client.get("/profiles/?q=imagenet").content.decode()
    assert "ResNet50" in html and "LAMMPS" not in html
    empty = alice_client.get("/profiles/?q=nothing-like-this").content.decode()
    assert "No profiles match these filters" in empty


def test_profiles_are_paginated(alice_client):
    for i in range(PROFILES_PER_PAGE + 1):
        ApplicationProfile.objects.create(name=f"app-{i:03d}", status="approved")
    first = alice_client.get("/profiles/").content.decode()
    assert "app-000" in first and f"app-{PROFILES_PER_PAGE:03d}" not in first
    second = alice_client.get("/profiles/?page=2").content.decode()
    assert f"app-{PROFILES_PER_PAGE:03d}" in second


def test_profile_detail_groups_metrics_by_algorithm_section(alice_client, lammps):
    html = alice_client.get(f"/profiles/{lammps.pk}/").content.decode()
    for title in [
        "Run times and memory",
        "Utilisation metrics",
        "Stall reasons and kernel resources",
        "Job descriptors",
    ]:
        assert title in html
    assert "78.18" in html  # stall: memory dependency
    assert "TitanXp" in html and "11.6×" in html  # 990 / 85
    assert "50% of run" in html and "833–1,895" in html
    assert "Warp efficiency" in html  # unmeasured metrics are listed with a dash


def test_profile_detail_shows_derived_classes_from_the_scheduler(alice_client, lammps):
    html = alice_client.get(f"/profiles/{lammps.pk}/").content.decode()
    assert '<span class="chip chip-strong">memory</span>' in html  # §3: mem dep 78% >= 33%
    assert '<span class="chip chip-strong">M</span>' in html  # §4: C/M = 40/20 < 10
    assert '<span class="chip chip-strong">medium</span>' in html  # 16 x 224


def test_derived_classes_show_a_dash_when_the_data_is_missing(alice_client):
    bare = ApplicationProfile.objects.create(name="Bare", status="approved")
    html = alice_client.get(f"/profiles/{bare.pk}/").content.decode()
    assert "chip-strong" not in html
    assert "Kernel class" in html


def test_a_draft_profile_is_404_for_users_but_visible_to_staff(client, alice, staff):
    draft = ApplicationProfile.objects.create(name="Draft-app", status="draft")
    client.force_login(alice)
    assert client.get(f"/profiles/{draft.pk}/").status_code == 404
    client.force_login(staff)
    html = client.get(f"/profiles/{draft.pk}/").content.decode()
    assert "Draft-app" in html
    assert "Submit a job with it" not in html
