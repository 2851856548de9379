"""The admin as the curation tool: profile list and edit pages with derived classes, approve and
retire actions, the import page; read-mostly jobs, nodes with GPUs, metrics, policy settings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from portal.core import services
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    MetricSample,
    Node,
    PolicySettings,
    ProfileGpuTime,
    ProfileMemoryStep,
)

pytestmark = pytest.mark.django_db
DATA = Path(__file__).parent / "data"
PROFILES = "/admin/core/applicationprofile/"


@pytest.fixture
def admin_client(client, staff):
    client.force_login(staff)
    return client


@pytest.fixture
def bs(staff):
    profile = ApplicationProfile.objects.create(
        name="BlackScholes",
        kind="hpc",
        stall_memory_dependency_pct=73.81,
        stall_exec_dependency_pct=6.36,
        cm_ratio=3.69,
        batch_size=64,
        image_size=448,
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="TitanXp", time_s=21)
    ProfileMemoryStep.objects.create(
        profile=profile, index=1, start_fraction=0, from_mb=0, to_mb=483
    )
    return profile


def test_changelist_has_filters_search_and_an_import_link(admin_client, bs):
    response = admin_client.get(PROFILES + "?status__exact=draft&q=Black")
    assert response.status_code == 200
    html = response.content.decode()
    assert "BlackScholes" in html
    assert f"{PROFILES}import/" in html
    for f in ("status", "kind", "source"):
        assert f"{f}__exact" in html


def test_change_page_shows_inlines_and_derived_classes(admin_client, bs):
    response = admin_client.get(f"{PROFILES}{bs.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "gpu_times-0-gpu_model" in html and "memory_steps-0-to_mb" in html
    classes = response.context["adminform"].form.instance
    admin_obj = response.context["adminform"].model_admin
    assert admin_obj.kernel_class(classes) == "memory"  # 73.81 % memory-dependency stalls
    assert admin_obj.cm_class(classes) == "M"  # 3.69 < 10
    assert admin_obj.scale_class(classes) == "big"  # 64 x 448


def test_derived_classes_show_a_dash_without_data_or_module(admin_client, monkeypatch):
    from portal.core.admin import ApplicationProfileAdmin

    empty = ApplicationProfile.objects.create(name="empty")
    model_admin = ApplicationProfileAdmin(ApplicationProfile, None)
    assert model_admin.kernel_class(empty) == "—"
    monkeypatch.setitem(sys.modules, "scheduler.classes", None)  # import fails
    fresh = ApplicationProfile.objects.get(pk=empty.pk)
    fresh.stall_memory_dependency_pct = 90
    assert model_admin.kernel_class(fresh) == "—"
    assert admin_client.get(f"{PROFILES}{empty.pk}/change/").status_code == 200


def test_inline_edit_of_gpu_times_and_memory_steps(admin_client, bs):
    page = admin_client.get(f"{PROFILES}{bs.pk}/change/")
    form = page.context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items() if k not in ("args",)}
    data.update(
        {
            "args": "{}",
            "gpu_times-TOTAL_FORMS": "2",
            "gpu_times-INITIAL_FORMS": "1",
            "gpu_times-0-id": bs.gpu_times.get().pk,
            "gpu_times-0-profile": bs.pk,
            "gpu_times-0-gpu_model": "TitanXp",
            "gpu_times-0-time_s": "22",
            "gpu_times-1-profile": bs.pk,
            "gpu_times-1-gpu_model": "V100",
            "gpu_times-1-time_s": "12",
            "memory_steps-TOTAL_FORMS": "1",
            "memory_steps-INITIAL_FORMS": "1",
            "memory_steps-0-id": bs.memory_steps.get().pk,
            "memory_steps-0-profile": bs.pk,
            "memory_steps-0-index": "1",
            "memory_steps-0-start_fraction": "0",
            "memory_steps-0-from_mb": "0",
            "memory_steps-0-to_mb": "500",
        }
    )
    response = admin_client.post(f"{PROFILES}{bs.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert {t.gpu_model: t.time_s for t in bs.gpu_times.all()} == {"TitanXp": 22, "V100": 12}
    assert bs.memory_steps.get().to_mb == 500


def test_approve_and_retire_actions(admin_client, staff, bs):
    response = admin_client.post(
        PROFILES, {"action": "approve", "_selected_action": [bs.pk]}, follow=True
    )
    assert response.status_code == 200
    bs.refresh_from_db()
    assert (bs.status, bs.approved_by) == ("approved", staff)
    assert bs.approved_at is not None
    admin_client.post(PROFILES, {"action": "retire", "_selected_action": [bs.pk]})
    bs.refresh_from_db()
    assert bs.status == "retired"


def test_import_page_imports_a_file(admin_client):
    assert admin_client.get(f"{PROFILES}import/").status_code == 200
    upload = SimpleUploadedFile("profiles.csv", (DATA / "profiles.csv").read_bytes())
    response = admin_client.post(
        f"{PROFILES}import/", {"file": upload, "status": "approved", "format": ""}
    )
    assert response.status_code == 302
    assert ApplicationProfile.objects.filter(status="approved", source="imported").count() == 3


def test_import_page_lists_row_errors_and_stores_nothing(admin_client):
    upload = SimpleUploadedFile("bad.csv", (DATA / "profiles_bad_row.csv").read_bytes())
    response = admin_client.post(f"{PROFILES}import/", {"file": upload, "status": "draft"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Nothing imported: 5 errors" in html
    assert "<td>3</td><td>kind</td>" in html
    assert ApplicationProfile.objects.count() == 0


def test_import_page_is_for_staff_only(client, alice):
    client.force_login(alice)
    response = client.get(f"{PROFILES}import/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_job_admin_is_read_mostly_with_events(admin_client, alice):
    job, _ = services.job_submit(alice, name="train", command="python x.py")
    assert admin_client.get("/admin/core/job/?state__exact=PENDING").status_code == 200
    page = admin_client.get(f"/admin/core/job/{job.pk}/change/")
    assert page.status_code == 200
    assert "submitted" in page.content.decode()
    assert admin_client.get("/admin/core/job/add/").status_code == 403
    admin_client.post("/admin/core/job/", {"action": "cancel", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.state == "CANCELLED"
    assert job.events.last().actor == "admin:sam"


def test_node_admin_with_gpu_inline(admin_client):
    node = Node.objects.create(name="gpu-1", kind="gpu", cores=8)
    Gpu.objects.create(node=node, index=0, model="A30", memory_mb=24576)
    assert admin_client.get("/admin/core/node/").status_code == 200
    page = admin_client.get(f"/admin/core/node/{node.pk}/change/")
    assert "gpus-0-model" in page.content.decode()


def test_metric_samples_are_read_only(admin_client):
    sample = MetricSample.objects.create(at=timezone.now(), metric="util_pct", value=50)
    assert admin_client.get("/admin/core/metricsample/").status_code == 200
    assert admin_client.get(f"/admin/core/metricsample/{sample.pk}/change/").status_code == 200
    assert admin_client.get("/admin/core/metricsample/add/").status_code == 403
    assert (
        admin_client.post(
            f"/admin/core/metricsample/{sample.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )


def test_policy_settings_admin(admin_client):
    policy = PolicySettings.objects.create(name="default", policy="fifo")
    assert admin_client.get("/admin/core/policysettings/").status_code == 200
    assert admin_client.get(f"/admin/core/policysettings/{policy.pk}/change/").status_code == 200
