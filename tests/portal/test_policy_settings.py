"""Policy settings that cannot break scheduling (issue 18, part 1): the admin offers the
registered policies and a typed field per documented parameter, and refuses to save an unknown
policy, a parameter of the wrong type or range, or one the policy itself refuses."""

from __future__ import annotations

import pytest

from portal.core.models import PolicySettings
from portal.core.policy_settings import policy_parameters, validate_policy_settings
from scheduler.policies.registry import available_policies, build_policy

pytestmark = pytest.mark.django_db

ADD = "/admin/core/policysettings/add/"


def _form(policy: str, **params: str) -> dict[str, str]:
    data = {"name": "main", "policy": policy, "active": "on"}
    for spec in policy_parameters(policy):
        if spec.kind == "bool":
            if spec.default:
                data[f"param__{spec.name}"] = "on"
        else:
            data[f"param__{spec.name}"] = ""
    data.update({f"param__{k}": v for k, v in params.items()})
    return data


@pytest.mark.parametrize("name", available_policies())
def test_every_registered_policy_validates_with_its_defaults(name):
    assert validate_policy_settings(name, {}) == {}
    for spec in policy_parameters(name):
        assert spec.describe()  # type and range in words, for the form's help


@pytest.mark.parametrize(
    ("name", "params", "field", "message"),
    [
        ("banana", {}, "policy", "unknown policy 'banana'; choose one of"),
        ("binpack", {"max_jobs_per_gpu": "lots"}, "max_jobs_per_gpu", "must be a whole number"),
        ("binpack", {"max_jobs_per_gpu": 0}, "max_jobs_per_gpu", "must be at least 1"),
        ("binpack", {"share_mode": "magic"}, "share_mode", "must be one of auto, mps"),
        ("binpack", {"nope": 1}, "params", "has no parameter(s) nope"),
        ("mystic", {"unknown_similarity": 2.0}, "unknown_similarity", "must be at most 1"),
        ("placement_rate", {"features": {"x": 1}}, "params", "unknown rate feature(s) x"),
        ("fifo", [1, 2], "params", "must be a JSON object"),
    ],
)
def test_bad_settings_name_the_field(name, params, field, message):
    errors = validate_policy_settings(name, params)
    assert message in errors[field]


def test_a_valid_configuration_is_one_the_policy_builds():
    params = {"max_jobs_per_gpu": 5, "interval_s": 2.0}
    assert validate_policy_settings("placement_rate+exec_plan", params) == {}
    assert build_policy("placement_rate+exec_plan", params).inner.params["max_jobs_per_gpu"] == 5


def test_the_admin_offers_the_registered_policies_and_their_parameters(client, staff):
    client.force_login(staff)
    html = client.get(ADD).content.decode()
    for name in available_policies():
        assert f'<option value="{name}"' in html
    assert 'name="param__max_jobs_per_gpu"' in html
    assert "co-location limit under MPS and time-slicing. integer, 1 to 64; default 2" in html


def test_the_admin_saves_a_good_configuration_with_only_what_differs(client, staff):
    client.force_login(staff)
    response = client.post(ADD, _form("binpack", max_jobs_per_gpu="3"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = PolicySettings.objects.get(name="main")
    assert (row.policy, row.params) == ("binpack", {"max_jobs_per_gpu": 3})


@pytest.mark.parametrize(
    ("policy", "params", "field", "message"),
    [
        ("banana", {}, "policy", "Select a valid choice. banana is not one of"),
        (
            "binpack",
            {"max_jobs_per_gpu": "lots"},
            "param__max_jobs_per_gpu",
            "Enter a whole number.",
        ),
        (
            "binpack",
            {"max_jobs_per_gpu": "0"},
            "param__max_jobs_per_gpu",
            "greater than or equal to 1",
        ),
        ("binpack", {"weights": "{not json"}, "param__weights", "not valid JSON"),
        ("placement_rate", {"features": '{"x": 1}'}, None, "unknown rate feature(s) x"),
    ],
)
def test_the_admin_refuses_bad_settings_with_field_errors(
    client, staff, policy, params, field, message
):
    client.force_login(staff)
    data = _form("binpack" if policy == "banana" else policy, **params)
    data["policy"] = policy
    response = client.post(ADD, data)
    assert response.status_code == 200
    form = response.context["adminform"].form
    errors = form.errors.get(field or "__all__", [])
    assert any(message in e for e in errors), form.errors
    assert not PolicySettings.objects.filter(name="main").exists()


def test_the_list_flags_a_configuration_saved_before_validation(client, staff):
    PolicySettings.objects.create(name="old", policy="banana", params={}, active=True)
    client.force_login(staff)
    html = client.get("/admin/core/policysettings/").content.decode()
    assert "policy: unknown policy &#x27;banana&#x27;" in html


def test_a_policy_that_fails_on_the_current_queue_is_refused(monkeypatch):
    from scheduler.policies.fifo import FifoPolicy

    def boom(self, state, rng):
        raise RuntimeError("boom")

    monkeypatch.setattr(FifoPolicy, "schedule", boom)
    assert validate_policy_settings("fifo", {}) == {
        "params": "the policy fails on the current queue: RuntimeError: boom"
    }
    assert validate_policy_settings("fifo", {}, trial=False) == {}


@pytest.mark.parametrize("name", available_policies())
def test_every_parameter_of_every_registered_policy_is_documented(name):
    """Help text for the admin form and docs/reference, and a default inside its own range."""
    from portal.core.policy_settings import check_value

    specs = policy_parameters(name)
    for spec in specs:
        assert len(spec.help) >= 15, f"{name}: parameter {spec.name} has no help text"
        assert check_value(spec, spec.default) is None, f"{name}: default of {spec.name}"


def test_a_text_parameter_is_checked_and_offered_as_text(client, staff):
    errors = validate_policy_settings("coscheml", {"model": 3}, trial=False)
    assert "must be non-empty text" in errors["model"]
    client.force_login(staff)
    html = client.get(ADD + "?policy=coscheml").content.decode()
    assert 'name="param__model"' in html and "the trained interference model" in html
