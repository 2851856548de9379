"""Input hardening (issue 12, parts 4 and 5): every bad input a 400 naming the field (never a
500 from the database), oversized bodies a JSON 413, throttles per user and per token, login
lockout, password rules."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from portal.api.throttles import TokenRateThrottle
from portal.core.models import ApplicationProfile, Job
from portal.core.validation import COMMAND_MAX_BYTES
from portal.front.services import token_create

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"
IMPORT = "/api/v1/profiles/import/"
BIG = 2**31


def _post_raw(api: APIClient, body: str, url: str = URL):
    return api.generic("POST", url, body.encode("utf-8", "surrogatepass"), "application/json")


@pytest.mark.parametrize(
    "field", ["gpus", "cpus", "memory_mb", "gpu_memory_mb", "elastic_min_workers", "priority"]
)
def test_integers_past_what_the_database_stores_are_a_400(alice_api, field):
    response = alice_api.post(URL, {"name": "x", "command": "run", field: BIG}, format="json")
    assert response.status_code == 400
    assert "less than or equal to" in response.json()[field][0]
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ('{"name": "a\\u0000b", "command": "run"}', "name", "Null characters are not allowed"),
        ('{"name": "a\\ud800b", "command": "run"}', "name", "Surrogate characters"),
        ('{"name": "x", "command": "run\\u0000"}', "command", "Null characters"),
        ('{"name": "x", "command": "run", "params": {"k": "v\\u0000"}}', "params", "NUL"),
        ('{"name": "x", "command": "run", "params": {"k\\u0000": 1}}', "params", "NUL"),
        ('{"name": "x", "command": "run", "params": {"k": "\\udc00"}}', "params", "surrogate"),
        (
            '{"name": "x", "command": "run", "params": {"k": [1, {"deep": "\\ud800"}]}}',
            "params",
            "at k[1].deep",
        ),
        ('{"name": "x", "command": "   "}', "command", "give a command"),
        ('{"name": "x"}', "command", "This field is required."),
    ],
)
def test_bad_text_is_a_400_naming_the_field(alice_api, body, field, message):
    response = _post_raw(alice_api, body)
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()[field])
    assert Job.objects.count() == 0


def test_deep_params_are_a_400_and_very_deep_json_is_a_parse_error(alice_api):
    deep = {"a": 1}
    for _ in range(25):
        deep = {"d": deep}
    response = alice_api.post(URL, {"name": "x", "command": "run", "params": deep}, format="json")
    assert response.status_code == 400
    assert response.json()["params"][0].startswith("nested 21 levels deep")
    body = '{"name": "x", "command": "run", "params": ' + "[" * 5000 + "]" * 5000 + "}"
    response = _post_raw(alice_api, body)
    assert response.status_code == 400
    assert response.json()["detail"] == "JSON parse error - nested 5001 levels deep; at most 64"
    assert (
        _post_raw(alice_api, '{"name": "x", "command": "run", "params": {"v": NaN}}').status_code
        == 400
    )
    assert Job.objects.count() == 0


def test_a_command_longer_than_the_kernel_takes_is_a_400_with_the_limit(alice_api):
    command = "echo " + "x" * (1024 * 1024)
    response = alice_api.post(URL, {"name": "x", "command": command}, format="json")
    assert response.status_code == 400
    message = response.json()["command"][0]
    assert f"at most {COMMAND_MAX_BYTES:,} bytes" in message and "MAX_ARG_STRLEN" in message
    fits = "x" * COMMAND_MAX_BYTES
    assert alice_api.post(URL, {"name": "x", "command": fits}, format="json").status_code == 201


def test_a_body_over_the_limit_is_a_json_413(alice_api, settings):
    body = json.dumps({"name": "x", "command": "x" * (10 * 1024 * 1024)})
    response = alice_api.generic("POST", URL, body, "application/json")
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert response.json()["detail"].startswith("request body too large: 10,485,")
    assert response.json()["limit_bytes"] == settings.COSCHED["API_MAX_BODY_BYTES"]


# -- the browser form ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"gpus": BIG}, "gpus", "less than or equal to 4096"),
        ({"memory_mb": BIG}, "memory_mb", "less than or equal to"),
        ({"params": "[" * 5000 + "]" * 5000}, "params", "nested 5000 levels deep"),
        ({"params": '{"a": NaN}'}, "params", "NaN is not a number JSON allows"),
        ({"command": "x" * (COMMAND_MAX_BYTES + 1)}, "command", "MAX_ARG_STRLEN"),
        ({"name": "a\x00b"}, "name", "Null characters"),
    ],
)
def test_the_form_names_each_bad_field(client, alice, data, field, message):
    client.force_login(alice)
    response = client.post("/jobs/new/", {"name": "x", "command": "run", **data})
    assert response.status_code == 400
    assert message in " ".join(response.context["form"].errors[field])
    assert Job.objects.count() == 0


# -- profile import: all or nothing, a 400 with each bad row --------------------------------------

CSV_HEAD = "name,version,kind,batch_size,description\n"


@pytest.mark.parametrize(
    ("payload", "fmt", "field", "message"),
    [
        (
            CSV_HEAD + f"big,1,hpc,{BIG},ok\n",
            "csv",
            "batch_size",
            "too large: at most 2,147,483,647",
        ),
        (CSV_HEAD + "nul\x00name,1,hpc,1,ok\n", "csv", "file", "NUL"),
        (CSV_HEAD + "wide,1,hpc,1," + "x" * 200_000 + "\n", "csv", "file", "a cell is longer than"),
        (
            CSV_HEAD + "wide,1,hpc,1," + "x" * 70_000 + "\n",
            "csv",
            "description",
            "cell longer than 65,536",
        ),
        ('[{"name": "a\\ud800b"}]', "json", "name", "lone surrogate (U+D800)"),
        ('[{"name": "ok", "args": {"k": "\\u0000"}}]', "json", "args", "NUL"),
        ('[{"name": "ok", "batch_size": 1e12}]', "json", "batch_size", "too large"),
        ("[" * 5000 + "]" * 5000, "json", "file", "nested 5000 levels deep"),
        ('[{"name": "ok", "gpu_time_s": {"V100": NaN}}]', "json", "file", "NaN"),
    ],
)
def test_each_bad_import_is_a_400_and_stores_nothing(staff_api, payload, fmt, field, message):
    ApplicationProfile.objects.create(name="kept", status="approved")
    good = CSV_HEAD + "fine,1,hpc,1,ok\n" if fmt == "csv" else '{"name": "fine"}'
    bad = payload.replace("\n", "\n" + good.split("\n", 1)[1], 1) if fmt == "csv" else payload
    response = staff_api.post(IMPORT, {"content": bad, "format": fmt}, format="json")
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert body["detail"].startswith("nothing imported:")
    assert any(e["field"] == field and message in e["message"] for e in body["errors"]), body
    assert list(ApplicationProfile.objects.values_list("name", flat=True)) == ["kept"]


def test_a_binary_upload_is_a_400(staff_api):
    from django.core.files.uploadedfile import SimpleUploadedFile

    png = SimpleUploadedFile("trace.csv", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    response = staff_api.post(IMPORT, {"file": png}, format="multipart")
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"row": None, "field": "file", "message": "not UTF-8 text"}
    ]
    text_with_nul = SimpleUploadedFile("p.csv", b"name,version\nx\x00y,1\n")
    response = staff_api.post(IMPORT, {"file": text_with_nul}, format="multipart")
    assert response.status_code == 400
    assert "binary data" in response.json()["errors"][0]["message"]


# -- throttles, lockout, passwords ---------------------------------------------------------


def test_each_token_has_its_own_request_budget(alice, monkeypatch):
    from django.core.cache import cache

    cache.clear()
    monkeypatch.setattr(TokenRateThrottle, "THROTTLE_RATES", {"token": "3/min"})
    _, first = token_create(alice, name="ci")
    _, second = token_create(alice, name="laptop")
    api = APIClient()
    codes = []
    for _ in range(4):
        api.credentials(HTTP_AUTHORIZATION=f"Token {first}")
        codes.append(api.get("/api/v1/me/").status_code)
    assert codes == [200, 200, 200, 429]
    api.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert api.get("/api/v1/me/").status_code == 200
    cache.clear()


def test_a_user_is_throttled_over_all_their_tokens(alice, monkeypatch):
    from django.core.cache import cache
    from rest_framework.throttling import UserRateThrottle

    cache.clear()
    monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": "2/min"})
    keys = [token_create(alice, name=f"t{i}")[1] for i in range(3)]
    api = APIClient()
    codes = []
    for key in keys:
        api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        codes.append(api.get("/api/v1/me/").status_code)
    assert codes == [200, 200, 429]
    cache.clear()


def test_repeated_failed_logins_lock_the_account_for_that_address(client, alice, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post("/login/", {"username": "alice", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    locked = client.post("/login/", {"username": "alice", "password": "wrong"})
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    # Even the right password is refused while locked out.
    again = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    assert again.status_code == 429
    assert "_auth_user_id" not in client.session


def test_a_successful_login_resets_the_failure_count(client, alice, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post("/login/", {"username": "alice", "password": "wrong"})
    ok = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    assert ok.status_code == 302
    client.logout()
    assert client.post("/login/", {"username": "alice", "password": "wrong"}).status_code == 200


@pytest.mark.parametrize(
    ("password", "message"),
    [
        ("short1", "too short"),
        ("password123", "too common"),
        ("83749261054", "entirely numeric"),
        ("alice-example", "too similar"),
    ],
)
def test_django_full_password_rules(alice, password, message):
    with pytest.raises(ValidationError) as caught:
        validate_password(password, alice)
    assert any(message in m for m in caught.value.messages)


def test_an_import_body_that_is_not_json_gets_the_import_error_shape(staff_api):
    # Found by the schemathesis run: bytes that are not UTF-8 under a JSON content type.
    response = staff_api.generic("POST", IMPORT, b"\xb5\x16WP", "application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["detail"].startswith("nothing imported")
    assert [e["field"] for e in body["errors"]] == ["body"]
    assert "JSON parse error" in body["errors"][0]["message"]
