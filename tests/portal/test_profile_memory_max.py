"""A profile's declared GPU memory maximum must cover its memory steps' peak (issue 18, part 6):
LAMMPS's published 2,273 MB next to steps up to 8,317 MB made "fill in from profile" ask too
little. Every way in refuses it as a field error on ``gpu_memory_max_mb``, and stores nothing."""

from __future__ import annotations

import json

import pytest

from portal.core import services
from portal.core.importers import ProfileImportError, ProfileRecord, parse_profiles
from portal.core.models import ApplicationProfile
from portal.front.forms import profile_defaults

pytestmark = pytest.mark.django_db

URL = "/api/v1/profiles/"
STEPS = [
    {"start_fraction": 0.0, "from_mb": 0, "to_mb": 833},
    {"start_fraction": 0.25, "from_mb": 833, "to_mb": 1895},
    {"start_fraction": 0.5, "from_mb": 1895, "to_mb": 2795},
    {"start_fraction": 0.75, "from_mb": 2795, "to_mb": 8317},
]
LAMMPS = {"name": "LAMMPS", "kind": "hpc", "gpu_memory_max_mb": 2273, "memory_steps": STEPS}


def test_the_importer_names_the_field():
    with pytest.raises(ProfileImportError) as info:
        parse_profiles(json.dumps([LAMMPS]), fmt="json")
    [error] = info.value.errors
    assert error.field == "gpu_memory_max_mb"
    assert "2,273 MB is below the peak of the profile's memory steps (8,317 MB)" in error.message
    # the peak itself, or no declared maximum, is fine
    assert parse_profiles(json.dumps([{**LAMMPS, "gpu_memory_max_mb": 8317}]))
    assert parse_profiles(json.dumps([{**LAMMPS, "gpu_memory_max_mb": None}]))


def test_the_api_refuses_it_on_create_and_on_a_patch_of_either_side(staff_api):
    response = staff_api.post(URL, LAMMPS, format="json")
    assert response.status_code == 400
    assert "below the peak" in response.json()["gpu_memory_max_mb"][0]
    assert not ApplicationProfile.objects.exists()

    pk = staff_api.post(URL, {**LAMMPS, "gpu_memory_max_mb": 8317}, format="json").json()["id"]
    response = staff_api.patch(f"{URL}{pk}/", {"gpu_memory_max_mb": 2273}, format="json")
    assert response.status_code == 400
    assert "8,317 MB" in response.json()["gpu_memory_max_mb"][0]
    higher = [*STEPS[:3], {"start_fraction": 0.75, "from_mb": 2795, "to_mb": 9000}]
    response = staff_api.patch(f"{URL}{pk}/", {"memory_steps": higher}, format="json")
    assert response.status_code == 400
    assert "9,000 MB" in response.json()["gpu_memory_max_mb"][0]
    profile = ApplicationProfile.objects.get(pk=pk)
    assert profile.gpu_memory_max_mb == 8317
    assert [s.to_mb for s in profile.memory_steps.all()] == [833, 1895, 2795, 8317]


def test_an_import_updating_a_stored_profile_is_checked_against_its_stored_steps(staff):
    good = {**LAMMPS, "gpu_memory_max_mb": 8317}
    services.profile_import(json.dumps([good]), actor=staff, fmt="json")
    with pytest.raises(ProfileImportError) as info:
        services.profile_import(
            json.dumps([{"name": "LAMMPS", "gpu_memory_max_mb": 1000}]),
            actor=staff,
            fmt="json",
            update_existing=True,
        )
    assert [e.field for e in info.value.errors] == ["gpu_memory_max_mb"]
    assert ApplicationProfile.objects.get(name="LAMMPS").gpu_memory_max_mb == 8317


def test_the_admin_refuses_steps_above_the_declared_maximum(client, staff):
    record = ProfileRecord(
        row=None,
        fields={"name": "LAMMPS", "version": "1", "kind": "hpc", "gpu_memory_max_mb": 8317},
        memory_steps=[(s["start_fraction"], s["from_mb"], s["to_mb"]) for s in STEPS],
    )
    profile = services.profile_save(record, actor=staff)
    client.force_login(staff)
    url = f"/admin/core/applicationprofile/{profile.pk}/change/"
    page = client.get(url)
    form = page.context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items() if k in form.fields}
    data.update(
        {
            "name": "LAMMPS",
            "version": "1",
            "kind": "hpc",
            "status": "draft",
            "source": "manual",
            "gpu_memory_max_mb": "2273",
            "args": "{}",
            "sources": "{}",
        }
    )
    for formset in page.context["inline_admin_formsets"]:
        fs = formset.formset
        prefix = fs.prefix
        data[f"{prefix}-TOTAL_FORMS"] = str(len(fs.forms))
        data[f"{prefix}-INITIAL_FORMS"] = str(len(fs.initial_forms))
        for i, f in enumerate(fs.forms):
            for name in f.fields:
                value = f.initial.get(name)
                if name == "profile":
                    value = profile.pk
                if name == "id":
                    value = f.instance.pk
                data[f"{prefix}-{i}-{name}"] = "" if value is None else str(value)
    response = client.post(url, data)
    assert response.status_code == 200
    assert (
        "below the peak of the profile&#x27;s memory steps (8,317 MB)" in response.content.decode()
    )
    assert ApplicationProfile.objects.get(pk=profile.pk).gpu_memory_max_mb == 8317


def test_fill_in_from_profile_asks_for_the_peak_of_an_older_profile(staff):
    """A profile stored before the check (declared below its peak) still fills in the peak."""
    record = ProfileRecord(
        row=None,
        fields={"name": "old", "version": "1", "kind": "hpc"},
        memory_steps=[(s["start_fraction"], s["from_mb"], s["to_mb"]) for s in STEPS],
    )
    profile = services.profile_save(record, actor=staff)
    ApplicationProfile.objects.filter(pk=profile.pk).update(gpu_memory_max_mb=2273)
    profile.refresh_from_db()
    assert profile_defaults(profile)["gpu_memory_mb"] == 8317
