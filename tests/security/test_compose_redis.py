"""The Redis of docker-compose.yml, started for real (``redis-server`` with the service's own
command line, its variables filled in): passwords required, append-only persistence, and the
node agents' user able to subscribe to nudges and nothing else."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

from workers.agent import NudgeListener
from workers.protocol import nudge_channel

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"REDIS_PASSWORD": "admin-pw-123", "REDIS_AGENT_PASSWORD": "agent-pw-456"}


def _interpolate(text: str) -> str:
    """Compose's ``${NAME:?message}`` / ``${NAME:-default}`` with ``PASSWORDS``."""
    return re.sub(r"\$\{(\w+)(?::[?-][^}]*)?\}", lambda m: PASSWORDS[m.group(1)], text)


@pytest.fixture
def compose_redis(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        reason = ("no redis-server binary on this machine (the compose file is checked in "
                  "tests/portal/test_deployment.py)")  # fmt: skip
        if os.environ.get("CI") == "true":  # CI starts redis-server (.ci/run): a broken set-up
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]
    argv = [_interpolate(a) for a in service["command"]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [server, *argv[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    admin = redis.Redis(port=port, password=PASSWORDS["REDIS_PASSWORD"])
    deadline = time.monotonic() + 10
    while True:
        try:
            admin.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.05)
    yield port, admin
    proc.terminate()
    proc.wait(10)


def test_redis_wants_a_password_and_persists(compose_redis):
    port, admin = compose_redis
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).ping()
    assert admin.config_get("appendonly") == {"appendonly": "yes"}


def test_the_agents_user_may_only_listen_for_nudges(compose_redis):
    port, admin = compose_redis
    url = f"redis://cosched-agent:{PASSWORDS['REDIS_AGENT_PASSWORD']}@127.0.0.1:{port}/0"
    agent = redis.Redis.from_url(url)
    for forbidden in (
        lambda: agent.publish(nudge_channel("gpu-1"), "kill"),
        lambda: agent.lpush("scheduler", "{}"),
        lambda: agent.get("anything"),
        lambda: agent.keys("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    heard = []
    listener = NudgeListener(url, "gpu-1", lambda: heard.append(1))
    listener.start()
    try:
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            time.sleep(0.02)
        while admin.publish(nudge_channel("gpu-1"), "") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        while len(heard) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        listener.stop()
        listener.join(5)
    assert len(heard) >= 2  # subscribed, then the portal's nudge arrived
