"""docker-compose.yml and the Dockerfile agree with the code they start (no Docker engine here:
the file is read as YAML, and each service's command is checked against what it names)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from portal.core.outbox import SCHEDULER_QUEUE

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {
    "POSTGRES_PASSWORD": "pg-pw",
    "REDIS_PASSWORD": "redis-pw",
    "REDIS_AGENT_PASSWORD": "a-pw",
}
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]


def test_the_deployment_has_every_part():
    assert {"postgres", "redis", "migrate", "web", "worker", "beat", "node-agent"} <= set(SERVICES)


def test_cosched_services_share_the_environment_the_settings_read():
    for name in ("migrate", "web", "worker", "beat"):
        env = SERVICES[name]["environment"]
        url = env["DATABASE_URL"]
        assert url.startswith("postgres://") and "@postgres:5432/" in url
        assert env["REDIS_URL"] == (
            "redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD in .env}@redis:6379/0"
        )
        assert env["DEBUG"] == "0" and "SECRET_KEY" in env and "ALLOWED_HOSTS" in env


def test_the_web_server_waits_for_the_migrations():
    assert SERVICES["web"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    assert SERVICES["migrate"]["command"][-2:] == ["migrate", "--noinput"]


def test_the_scheduler_worker_serves_the_queue_cycles_are_sent_to():
    command = SERVICES["worker"]["command"]
    queues = command[command.index("-Q") + 1].split(",")
    assert SCHEDULER_QUEUE in queues
    assert command[:3] == ["celery", "-A", "portal"]


def test_the_node_agent_uses_nvml_and_reserves_the_hosts_gpus():
    service = SERVICES["node-agent"]
    command = service["command"]
    assert command[:3] == ["python", "-m", "workers.agent"]
    assert command[command.index("--backend") + 1] == "nvml"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)


def test_the_node_agent_holds_no_database_credentials_only_its_node_token():
    service = SERVICES["node-agent"]
    env = service["environment"]
    assert not {"DATABASE_URL", "SECRET_KEY", "REDIS_URL"} & set(env)
    assert env["COSCHED_PORTAL_URL"].endswith("web:8000}")
    assert env["COSCHED_NODE_TOKEN_FILE"] == "/secrets/node.token"
    assert "node-secrets:/secrets:ro" in service["volumes"]  # written by node-token only
    # Its state outlives the container, so a restarted agent adopts its running attempts.
    state = env["COSCHED_DATA_DIR"]
    assert any(v.endswith(f":{state}") for v in service["volumes"])


def test_the_web_server_lets_agents_of_the_network_sync_over_http():
    env = SERVICES["web"]["environment"]
    assert "web" in env["ALLOWED_HOSTS"].split(",")
    assert env["SECURE_REDIRECT_EXEMPT"].split(",") == ["^agent/v1/", "^healthz$"]


def test_the_image_holds_every_top_level_package_the_services_import():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for folder in ("portal", "scheduler", "workers", "templates", "static"):
        assert f"COPY {folder} ./{folder}" in dockerfile, folder
    assert "COPY manage.py" in dockerfile


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")
def test_docker_compose_config_validates_where_the_plugin_exists():
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the docker client has no compose plugin here")
    done = subprocess.run(
        ["docker", "compose", "config", "--quiet"],
        cwd=ROOT,
        env={"SECRET_KEY": "x" * 50, "PATH": "/usr/bin:/bin", **PASSWORDS},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_postgres_and_redis_require_passwords_and_redis_persists():
    required = "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in .env}"
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"] == required
    for name in ("migrate", "web", "worker", "beat"):
        assert f"cosched:{required}@postgres" in SERVICES[name]["environment"]["DATABASE_URL"]
    command = SERVICES["redis"]["command"]
    assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in SERVICES["redis"]["volumes"])
    # Agents that get a nudge URL use the restricted "cosched-agent" user (documented in the
    # node-agent service); in compose they have none: Redis is out of their jobs' reach.
    command_text = " ".join(command)
    assert "--user cosched-agent on >${REDIS_AGENT_PASSWORD:?" in command_text
    assert "&cosched:nudge:* +subscribe" in command_text
    assert "redis://cosched-agent:${REDIS_AGENT_PASSWORD}@redis" in COMPOSE_TEXT
    assert "COSCHED_NUDGE_URL" not in SERVICES["node-agent"]["environment"]
    assert SERVICES["node-agent"]["environment"]["COSCHED_RUN_JOBS_AS"] == "owner"


def test_jobs_cannot_reach_redis_or_postgres():
    """Jobs run in the node agent's network namespace: its networks must not hold Redis or
    PostgreSQL; only the web portal bridges the two."""
    assert COMPOSE["networks"]["control"]["internal"] is True
    networks = {name: set(service.get("networks", ())) for name, service in SERVICES.items()}
    assert networks["redis"] == networks["postgres"] == {"control"}
    assert networks["node-agent"] == {"nodes"}
    assert networks["web"] == {"control", "nodes", "front"}
    assert networks["caddy"] == {"front"}
    for name in ("migrate", "worker", "beat", "node-token", "backup"):
        assert networks[name] == {"control"}, name
    reachable = {s for s, nets in networks.items() if nets & networks["node-agent"]}
    assert reachable == {"web", "node-agent"}
    assert "useradd --system" in (ROOT / "Dockerfile").read_text()


# -- the service graph, as `docker compose up -d` would walk it (issue 27) --------------------

ONE_SHOT = {"migrate", "node-token"}


def _after(name: str) -> dict[str, str]:
    return {dep: cond["condition"] for dep, cond in SERVICES[name].get("depends_on", {}).items()}


def _start_order() -> list[str]:
    """The order `docker compose up` starts the services in: each after what it depends on."""
    order: list[str] = []
    while len(order) < len(SERVICES):
        ready = [s for s in SERVICES if s not in order and all(d in order for d in _after(s))]
        assert ready, f"a dependency cycle among {set(SERVICES) - set(order)}"
        order.extend(sorted(ready))
    return order


def test_one_up_starts_everything_in_an_order_that_works():
    order = _start_order()
    assert order.index("migrate") > max(order.index("postgres"), order.index("redis"))
    for name in ("web", "worker", "beat", "node-token"):
        assert _after(name)["migrate"] == "service_completed_successfully", name
        assert order.index(name) > order.index("migrate")
    # The agent starts once its token exists and the portal answers.
    assert _after("node-agent") == {
        "node-token": "service_completed_successfully",
        "web": "service_healthy",
    }
    assert _after("caddy") == {"web": "service_healthy"}
    assert _after("backup") == {"postgres": "service_healthy"}
    for name in ONE_SHOT:
        assert SERVICES[name]["restart"] == "no", name


def test_every_long_running_service_has_a_healthcheck_and_only_caddy_publishes():
    for name, service in SERVICES.items():
        if name not in ONE_SHOT:
            assert "healthcheck" in service, name
        if name != "caddy":
            assert "ports" not in service, f"{name} publishes a port: only caddy may"
    assert sorted(SERVICES["caddy"]["ports"]) == ["443:443", "80:80"]
    # The web healthcheck asks the view that exists for it, exempt from the HTTPS redirect.
    assert "/healthz" in " ".join(SERVICES["web"]["healthcheck"]["test"])


def test_the_token_is_made_after_the_migrations_not_instead_of_them():
    command = " ".join(SERVICES["node-token"]["command"])
    assert "node_token create" in command and "--file /secrets/node.token" in command
    assert command.startswith("sh -c test -s /secrets/node.token ||")  # once per host
    for doc in ("docs/deploy.md", "README.md"):
        text = (ROOT / doc).read_text()
        assert "docker compose run --rm migrate python manage.py node_token" not in text, doc
        assert "docker compose up -d" in text, doc


def test_every_documented_compose_command_names_a_service_that_runs_it():
    """The README's and the deploy guide's steps are the ones the graph tests check: every
    ``docker compose exec|run SERVICE`` they give names a service of the file, ``exec`` one that
    keeps running (a one-shot has exited by then)."""
    import re

    seen = 0
    for doc in ("README.md", "docs/deploy.md", "docs/upgrade.md", "docs/nodes.md"):
        text = " ".join((ROOT / doc).read_text().split())
        for verb, service in re.findall(
            r"docker compose (exec|run)(?: --rm)? ([a-z][a-z0-9-]*)", text
        ):
            seen += 1
            assert service in SERVICES, (doc, service)
            if verb == "exec":
                assert service not in ONE_SHOT, (doc, service)
    assert seen >= 3


def test_the_caddyfile_fronts_the_portal_with_tls_self_signed_by_default():
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text()
    assert "{$COSCHED_SITE:localhost}" in caddyfile
    assert "tls {$COSCHED_TLS:internal}" in caddyfile
    assert "reverse_proxy web:8000" in caddyfile
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in SERVICES["caddy"]["volumes"]


def test_the_image_is_built_from_the_lock_with_the_docs_site():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml requirements.lock README.md mkdocs.yml ./" in dockerfile
    assert "COPY docs ./docs" in dockerfile
    assert "pip install --no-cache-dir -c requirements.lock ." in dockerfile
    assert "mkdocs build --strict -d var/docs-site" in dockerfile


@pytest.mark.django_db
def test_healthz_answers_without_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
