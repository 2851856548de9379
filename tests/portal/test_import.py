"""Profile import: our CSV and JSON schema, nvprof and Nsight Compute exports; every row
validated, one bad row rejects the whole file with row-level errors, nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from portal.core import services
from portal.core.importers import ProfileImportError, parse_memory_steps, parse_profiles
from portal.core.models import ApplicationProfile, ProfileGpuTime, ProfileMemoryStep

DATA = Path(__file__).parent / "data"


def read(name: str) -> bytes:
    return (DATA / name).read_bytes()


def errors_of(content, **kwargs) -> list[tuple[int | None, str]]:
    with pytest.raises(ProfileImportError) as info:
        parse_profiles(content, **kwargs)
    return [(e.row, e.field) for e in info.value.errors]


# --- parsing (no database) -------------------------------------------------------------------


def test_our_csv_schema():
    records = {r.fields["name"]: r for r in parse_profiles(read("profiles.csv"), fmt="csv")}
    assert set(records) == {"CNN-MNIST", "LAMMPS", "BlackScholes"}
    cnn = records["CNN-MNIST"]
    assert cnn.fields["cpu_time_s"] == 3752.0 and cnn.fields["batch_size"] == 64
    assert cnn.fields["args"] == {"epochs": 10}
    assert cnn.gpu_times == {"TitanXp": 198.0, "V100": 120.0}
    assert records["LAMMPS"].memory_steps == [
        (0.0, 0.0, 833.0),
        (0.25, 833.0, 1895.0),
        (0.5, 1895.0, 2795.0),
        (0.75, 2795.0, 8317.0),
    ]
    assert records["BlackScholes"].memory_steps is None  # empty cell: not given
    assert "sm_efficiency_pct" not in records["LAMMPS"].fields


def test_our_json_schema_with_aliases_of_gpu_models():
    records = parse_profiles(read("profiles.json"))
    resnet, spmv = records
    assert resnet.key == ("ResNet50-train", "2")
    assert resnet.gpu_times == {"V100": 310.5, "A30": 290.0, "K80": 1400.0}
    assert resnet.memory_steps == [(0.0, 0.0, 3500.0), (0.1, 3500.0, 7900.0)]
    assert spmv.fields["stall_memory_dependency_pct"] == 61.31
    assert spmv.fields["saturation_tbs_per_sm"] == 4


def test_nvprof_metrics_are_aggregated_into_one_profile():
    (record,) = parse_profiles(read("nvprof_blackscholes.csv"))
    f = record.fields
    assert f["name"] == "BlackScholes"  # from the "command:" line
    assert f["sm_efficiency_pct"] == 99.54
    assert f["occupancy_pct"] == pytest.approx(86.2345)  # 0..1 -> percent
    assert f["gld_gbps"] == 521.4 and f["gst_gbps"] == 347.6
    assert f["dram_bw_gbps"] == pytest.approx(519.88 + 346.12)  # read + write
    assert f["mem_util_pct"] == 90.0  # "High (9)"
    assert f["epc"] == 4.04
    assert f["gflops"] == pytest.approx(15700.0 * 0.1143, rel=1e-3)  # V100 peak x efficiency
    stalls = [f[k] for k in f if k.startswith("stall_")]
    assert len(stalls) == 6 and sum(stalls) == pytest.approx(100, abs=0.05)
    assert f["stall_memory_dependency_pct"] > 80  # a memory kernel (ALGORITHMS.md §3)


def test_nvprof_name_option_wins_and_kind_is_set():
    (record,) = parse_profiles(
        read("nvprof_blackscholes.csv"), fmt="nvprof", options={"name": "BS", "kind": "hpc"}
    )
    assert (record.fields["name"], record.fields["kind"]) == ("BS", "hpc")


def test_nvprof_with_several_kernels_weights_by_invocations():
    header = '"Device","Kernel","Invocations","Metric Name","Metric Description","Min","Max","Avg"'
    rows = [
        '"Tesla V100-SXM2-16GB (0)","k1",3,"ipc","Executed IPC",1,1,1.0',
        '"Tesla V100-SXM2-16GB (0)","k2",1,"ipc","Executed IPC",3,3,3.0',
    ]
    text = "\n".join([header, *rows])
    (record,) = parse_profiles(text, fmt="nvprof", options={"name": "two"})
    assert record.fields["ipc"] == pytest.approx(1.5)


def test_nvprof_bad_value_names_the_line_and_metric():
    text = read("nvprof_blackscholes.csv").decode().replace("0.625100", "n/a")
    assert errors_of(text) == [(17, "ipc")]


def test_ncu_details_page():
    (record,) = parse_profiles(read("ncu_details_spmv.csv"))
    f = record.fields
    assert f["name"] == "spmv"
    assert f["registers_per_block"] == 26 * 192
    assert f["smem_per_block_bytes"] == 0
    # kernel 1 runs 150 us, kernel 0 50 us: weights 3:1
    assert f["mem_util_pct"] == pytest.approx((78.4 * 50 + 80.0 * 150) / 200, rel=1e-4)
    assert f["dram_bw_gbps"] == pytest.approx((687.31 * 50 + 701.0 * 150) / 200, rel=1e-4)
    assert f["occupancy_pct"] == pytest.approx((71.12 * 50 + 72.0 * 150) / 200, rel=1e-4)
    assert f["warp_efficiency_pct"] == pytest.approx(100 * 29.1 / 32, rel=1e-4)


def test_ncu_raw_page_with_stall_reasons():
    (record,) = parse_profiles(read("ncu_raw_stencil.csv"), options={"name": "STENCIL"})
    f = record.fields
    assert f["name"] == "STENCIL"
    assert f["smem_per_block_bytes"] == 1000 and f["registers_per_block"] == 4096
    assert f["dram_bw_gbps"] == pytest.approx(600.2, abs=0.01)
    stalls = {k: v for k, v in f.items() if k.startswith("stall_")}
    assert sum(stalls.values()) == pytest.approx(100, abs=0.05)
    assert max(stalls, key=stalls.get) == "stall_memory_dependency_pct"  # STENCIL: memory


def test_format_detection():
    from portal.core.importers import detect_format

    assert detect_format(read("profiles.csv").decode()) == "csv"
    assert detect_format("[]") == "json"
    assert detect_format(read("nvprof_blackscholes.csv").decode()) == "nvprof"
    assert detect_format(read("ncu_details_spmv.csv").decode()) == "ncu"
    assert detect_format(read("ncu_raw_stencil.csv").decode()) == "ncu"


def test_a_bad_row_in_the_middle_reports_every_bad_field_of_it():
    errors = errors_of(read("profiles_bad_row.csv"))
    assert errors == [
        (3, "kind"),
        (3, "cpu_time_s"),
        (3, "gpu_time_s.V100"),
        (3, "memory_steps"),
        (3, "sm_efficiency_pct"),
    ]


@pytest.mark.parametrize(
    ("csv_text", "expected"),
    [
        ("name,cpu_tme_s\na,1\n", [(2, "cpu_tme_s")]),
        ("name,gpu_time_s.GTX9000\na,1\n", [(2, "gpu_time_s.GTX9000")]),
        ("name,cpu_time_s\n,1\n", [(2, "name")]),
        ("name,version\na,1\na,1\n", [(3, "name")]),
        ("name,registers_per_block\na,1.5\n", [(2, "registers_per_block")]),
        ("name,ipc\na,nan\n", [(2, "ipc")]),
        ("name,ipc\na,1,2\n", [(2, "(row)")]),
        ("name,args\na,{bad\n", [(2, "args")]),
        ("name,memory_steps\na,0-10;5\n", [(2, "memory_steps")]),
        ("name,memory_steps\na,0.5:0-10;0.2:10-20\n", [(2, "memory_steps")]),
        ("name,kind\n" + "x" * 101 + ",hpc\n", [(2, "name")]),
        ("name\n", [(None, "file")]),
        ("", [(None, "file")]),
    ],
)
def test_csv_errors_name_row_and_field(csv_text, expected):
    assert errors_of(csv_text, fmt="csv") == expected


def test_json_errors_name_position_and_field():
    data = [{"name": "ok"}, {"name": "bad", "gpu_time_s": {"V100": -1}}, "nope", {"ipc": 1}]
    assert errors_of(json.dumps(data)) == [(2, "gpu_time_s.V100"), (3, "(row)"), (4, "name")]
    assert errors_of("{oops", fmt="json") == [(None, "file")]
    assert errors_of("42", fmt="json") == [(None, "file")]


def test_memory_steps_forms():
    assert parse_memory_steps("0-833;833-1895") == [(0.0, 0.0, 833.0), (0.5, 833.0, 1895.0)]
    assert parse_memory_steps([{"from_mb": 0, "to_mb": 10}]) == [(0.0, 0.0, 10.0)]
    with pytest.raises(ValueError, match="outside 0..1"):
        parse_memory_steps("1.5:0-10")
    with pytest.raises(ValueError, match="for none"):
        parse_memory_steps("0:0-10;10-20")


def test_unknown_format_is_an_error():
    assert errors_of("name\na\n", fmt="xlsx") == [(None, "format")]


# --- services: all or nothing ----------------------------------------------------------------


@pytest.mark.django_db
def test_import_creates_draft_imported_profiles_with_children(staff):
    result = services.profile_import(read("profiles.csv"), actor=staff, filename="p.csv")
    assert len(result.created) == 3 and not result.updated
    lammps = ApplicationProfile.objects.get(name="LAMMPS")
    assert (lammps.status, lammps.source, lammps.created_by) == ("draft", "imported", staff)
    assert lammps.approved_by is None
    assert [(s.index, s.from_mb, s.to_mb) for s in lammps.memory_steps.all()] == [
        (1, 0, 833),
        (2, 833, 1895),
        (3, 1895, 2795),
        (4, 2795, 8317),
    ]
    cnn = ApplicationProfile.objects.get(name="CNN-MNIST")
    assert {t.gpu_model: t.time_s for t in cnn.gpu_times.all()} == {"TitanXp": 198, "V100": 120}


@pytest.mark.django_db
def test_import_as_approved_records_who_approved(staff):
    services.profile_import(read("profiles.json"), actor=staff, status="approved")
    profile = ApplicationProfile.objects.get(name="SPMV")
    assert profile.status == "approved"
    assert profile.approved_by == staff and profile.approved_at is not None


@pytest.mark.django_db
def test_a_bad_row_in_the_middle_stores_nothing(staff):
    with pytest.raises(ProfileImportError) as info:
        services.profile_import(read("profiles_bad_row.csv"), actor=staff)
    assert {e.row for e in info.value.errors} == {3}
    assert ApplicationProfile.objects.count() == 0
    assert ProfileGpuTime.objects.count() == 0


@pytest.mark.django_db
def test_a_failure_while_writing_rolls_back_the_rows_already_written(staff, monkeypatch):
    calls = []
    real = services._profile_write

    def failing_write(record, **kwargs):
        calls.append(record.key)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(record, **kwargs)

    monkeypatch.setattr(services, "_profile_write", failing_write)
    with pytest.raises(RuntimeError):
        services.profile_import(read("profiles.csv"), actor=staff)
    assert ApplicationProfile.objects.count() == 0
    assert ProfileMemoryStep.objects.count() == 0


@pytest.mark.django_db
def test_an_existing_name_and_version_is_an_error_unless_updating(staff):
    services.profile_import(read("profiles.csv"), actor=staff)
    changed = read("profiles.csv").decode().replace("3752,198", "3800,190")
    with pytest.raises(ProfileImportError) as info:
        services.profile_import(changed, actor=staff)
    assert [(e.row, e.field) for e in info.value.errors] == [(2, "name"), (3, "name"), (4, "name")]
    assert "update_existing" in info.value.errors[0].message
    assert ApplicationProfile.objects.get(name="CNN-MNIST").cpu_time_s == 3752

    result = services.profile_import(changed, actor=staff, update_existing=True)
    assert len(result.updated) == 3 and not result.created
    cnn = ApplicationProfile.objects.get(name="CNN-MNIST")
    assert cnn.cpu_time_s == 3800
    assert cnn.gpu_times.get(gpu_model="TitanXp").time_s == 190
    assert ApplicationProfile.objects.count() == 3


@pytest.mark.django_db
def test_updating_with_profiler_metrics_keeps_the_other_fields(staff):
    services.profile_import(read("profiles.csv"), actor=staff)
    services.profile_import(read("nvprof_blackscholes.csv"), actor=staff, update_existing=True)
    bs = ApplicationProfile.objects.get(name="BlackScholes")
    assert bs.cpu_time_s == 324  # from the CSV, kept
    assert bs.sm_efficiency_pct == 99.54  # from nvprof
    assert bs.gpu_times.get().gpu_model == "TitanXp"  # children not given: kept


# --- through the API ---------------------------------------------------------------------------

IMPORT = "/api/v1/profiles/import/"


@pytest.mark.django_db
def test_api_import_multipart(staff_api):
    upload = SimpleUploadedFile("profiles.csv", read("profiles.csv"), content_type="text/csv")
    response = staff_api.post(IMPORT, {"file": upload}, format="multipart")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert len(body["created"]) == 3
    assert {p["name"] for p in body["profiles"]} == {"CNN-MNIST", "LAMMPS", "BlackScholes"}
    assert all(p["status"] == "draft" and p["source"] == "imported" for p in body["profiles"])


@pytest.mark.django_db
def test_api_import_json_body(staff_api):
    profiles = json.loads(read("profiles.json"))["profiles"]
    response = staff_api.post(IMPORT, {"profiles": profiles, "status": "approved"}, format="json")
    assert response.status_code == 201, response.json()
    resnet = next(p for p in response.json()["profiles"] if p["name"] == "ResNet50-train")
    assert resnet["gpu_time_s"] == {"A30": 290.0, "K80": 1400.0, "V100": 310.5}
    assert resnet["status"] == "approved" and resnet["approved_by"] == "sam"


@pytest.mark.django_db
def test_api_import_nvprof_as_text(staff_api):
    response = staff_api.post(
        IMPORT,
        {"content": read("nvprof_blackscholes.csv").decode(), "format": "nvprof", "name": "BS"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["profiles"][0]["name"] == "BS"


@pytest.mark.django_db
def test_api_import_bad_file_is_a_400_with_row_errors(staff_api):
    upload = SimpleUploadedFile("bad.csv", read("profiles_bad_row.csv"), content_type="text/csv")
    response = staff_api.post(IMPORT, {"file": upload}, format="multipart")
    assert response.status_code == 400
    body = response.json()
    assert body["detail"].startswith("nothing imported")
    assert {k: body["errors"][0][k] for k in ("row", "field")} == {"row": 3, "field": "kind"}
    assert ApplicationProfile.objects.count() == 0


@pytest.mark.django_db
def test_api_import_needs_exactly_one_input(staff_api):
    assert staff_api.post(IMPORT, {}, format="json").status_code == 400
    both = {"content": "name\na\n", "profiles": [{"name": "b"}]}
    assert staff_api.post(IMPORT, both, format="json").status_code == 400
