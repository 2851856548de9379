"""Profiles through the API: staff create, update, approve, retire and delete; the same schema
as the JSON import."""

from __future__ import annotations

import pytest

from portal.core import services
from portal.core.models import ApplicationProfile

pytestmark = pytest.mark.django_db
URL = "/api/v1/profiles/"
LAMMPS = {
    "name": "LAMMPS",
    "kind": "hpc",
    "cpu_time_s": 990,
    "gpu_memory_max_mb": 2273,
    "gpu_time_s": {"TitanXp": 85, "tesla v100-sxm2-16gb": 40},
    "memory_steps": [
        {"start_fraction": 0, "from_mb": 0, "to_mb": 833},
        {"start_fraction": 0.5, "from_mb": 833, "to_mb": 2273},
    ],
    "stall_memory_dependency_pct": 40,
}


def test_staff_create_a_draft_profile(staff_api, staff):
    response = staff_api.post(URL, LAMMPS, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["status"], body["source"], body["version"]) == ("draft", "manual", "1")
    assert body["gpu_time_s"] == {"TitanXp": 85.0, "V100": 40.0}
    assert [s["to_mb"] for s in body["memory_steps"]] == [833, 2273]
    assert body["classes"]["kernel_class"] == "memory"
    profile = ApplicationProfile.objects.get(pk=body["id"])
    assert profile.created_by == staff


def test_create_rejects_bad_and_unknown_fields(staff_api):
    bad = {
        **LAMMPS,
        "gpu_time_s": {"GTX9000": 3},
        "sm_efficiency_pct": 150,
        "cpu_tme_s": 1,
        "status": "approved",
    }
    response = staff_api.post(URL, bad, format="json")
    assert response.status_code == 400
    assert {"cpu_tme_s", "status"} <= set(response.json())
    response = staff_api.post(URL, {**LAMMPS, "gpu_time_s": {"GTX9000": 3}}, format="json")
    assert response.status_code == 400 and "gpu_time_s.GTX9000" in response.json()
    response = staff_api.post(URL, {**LAMMPS, "sm_efficiency_pct": 150}, format="json")
    assert response.status_code == 400 and "sm_efficiency_pct" in response.json()
    steps = [
        {"start_fraction": 0.5, "from_mb": 0, "to_mb": 1},
        {"start_fraction": 0.2, "from_mb": 1, "to_mb": 2},
    ]
    response = staff_api.post(URL, {**LAMMPS, "memory_steps": steps}, format="json")
    assert response.status_code == 400 and "memory_steps" in response.json()
    assert ApplicationProfile.objects.count() == 0


def test_duplicate_name_and_version_is_a_400(staff_api):
    assert staff_api.post(URL, LAMMPS, format="json").status_code == 201
    response = staff_api.post(URL, LAMMPS, format="json")
    assert response.status_code == 400
    assert "name" in response.json()


def test_patch_changes_only_what_is_given(staff_api):
    pk = staff_api.post(URL, LAMMPS, format="json").json()["id"]
    response = staff_api.patch(f"{URL}{pk}/", {"cpu_time_s": 1000}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["cpu_time_s"] == 1000
    assert body["gpu_time_s"] == {"TitanXp": 85.0, "V100": 40.0}
    assert len(body["memory_steps"]) == 2
    response = staff_api.patch(f"{URL}{pk}/", {"gpu_time_s": {"A30": 30}}, format="json")
    assert response.json()["gpu_time_s"] == {"A30": 30.0}


def test_approve_then_retire(staff_api, staff, alice_api):
    pk = staff_api.post(URL, LAMMPS, format="json").json()["id"]
    assert alice_api.get(f"{URL}{pk}/").status_code == 404  # draft: hidden from users
    body = staff_api.post(f"{URL}{pk}/approve/").json()
    assert (body["status"], body["approved_by"]) == ("approved", "sam")
    assert alice_api.get(f"{URL}{pk}/").status_code == 200
    assert staff_api.post(f"{URL}{pk}/retire/").json()["status"] == "retired"


def test_delete_is_refused_while_jobs_use_the_profile(staff_api, alice):
    pk = staff_api.post(URL, LAMMPS, format="json").json()["id"]
    profile = services.profile_approve(ApplicationProfile.objects.get(pk=pk), actor=None)
    services.job_submit(alice, name="j", command="x", profile=profile)
    response = staff_api.delete(f"{URL}{pk}/")
    assert response.status_code == 400
    assert "retire" in response.json()["detail"]
    other = staff_api.post(URL, {"name": "unused"}, format="json").json()["id"]
    assert staff_api.delete(f"{URL}{other}/").status_code == 204


def test_profile_list_filters(staff_api):
    staff_api.post(URL, LAMMPS, format="json")
    staff_api.post(URL, {"name": "mnist", "kind": "dl-train"}, format="json")
    names = lambda q: [p["name"] for p in staff_api.get(URL + q).json()["results"]]  # noqa: E731
    assert names("?kind=hpc") == ["LAMMPS"]
    assert names("?search=mni") == ["mnist"]
    assert names("?status=approved") == []
