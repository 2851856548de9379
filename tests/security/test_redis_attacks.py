"""What a job that reaches Redis can do (issue 29), tried for real: against the Redis of these
tests as a lab starts it (no password: the job may do anything Redis allows) and against the
Redis of docker-compose.yml (passwords, the agents' subscribe-only user), with the real code
paths (the API's rate limiter in the cache, the agent sync storing log tails, a real Celery
worker reading the queue).

(a) a pickled object in the anonymous rate limiter's cache key runs no code, and the API still
answers; (b) nothing in Redis holds another user's log tail; (c) a forged Celery message
(unsigned, wrongly signed, pickled, or a signed body under another task's name) is not
executed, while a message the portal signs is.
"""

# ruff: noqa: F811  (the agent tests' fixtures, imported below, are test arguments here)

from __future__ import annotations

import base64
import builtins
import contextlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml

from portal.core import metrics, signed_messages
from portal.core.cache import JSONSerializer, UnreadableValue
from portal.settings import redis_cache
from tests.security.test_compose_redis import PASSWORDS, _interpolate
from tests.workers.test_agent import (  # noqa: F401  (fixtures)
    _clean_store,
    _job,
    _step_until,
    agent,
    backend,
    node,
    transport,
)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LAB_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
SIGNED = "application/x-cosched-signed+json"


@dataclass
class Target:
    """A Redis to attack: the URL the portal uses, and what a job holds (``job_url``: the
    credentials a job could have at best: none on the lab's, the agents' on compose's)."""

    name: str
    portal_url: str
    job_url: str

    def attacker(self) -> redis.Redis:
        """The attacker's client: the job's own where it may write, else (the compose Redis,
        which refuses it, as ``test_compose_refuses_the_jobs_credentials`` shows) the worst
        case, the control plane's password leaked."""
        return redis.Redis.from_url(self.job_url if self.name == "lab" else self.portal_url)


def _compose_redis_server(tmp: Path) -> tuple[subprocess.Popen, int]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("no redis-server binary: the compose variant of these attacks needs one")
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [_interpolate(a) for a in service["command"]]
    argv = [server, *argv[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    admin = redis.Redis(port=port, password=PASSWORDS["REDIS_PASSWORD"])
    deadline = time.monotonic() + 10
    while True:
        try:
            admin.ping()
            return proc, port
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def _compose_target(tmp: Path) -> Iterator[Target]:
    proc, port = _compose_redis_server(tmp)
    admin = PASSWORDS["REDIS_PASSWORD"]
    agent_pw = PASSWORDS["REDIS_AGENT_PASSWORD"]
    try:
        yield Target(
            "compose",
            f"redis://:{admin}@127.0.0.1:{port}/0",
            f"redis://cosched-agent:{agent_pw}@127.0.0.1:{port}/0",
        )
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(params=["lab", "compose"])
def target(request, tmp_path_factory):
    if request.param == "compose":
        with _compose_target(tmp_path_factory.mktemp("compose-redis")) as compose:
            yield compose
        return
    client = redis.Redis.from_url(LAB_URL)
    client.flushdb()
    yield Target("lab", LAB_URL, LAB_URL)
    client.flushdb()


def test_compose_refuses_the_jobs_credentials(tmp_path):
    """On the compose Redis a job has at best the agents' nudge credentials: none of the three
    attacks gets past Redis itself (the tests below go on as if the control plane's leaked)."""
    with _compose_target(tmp_path) as compose:
        job = redis.Redis.from_url(compose.job_url)
        for attack in (
            lambda: job.set("cosched-cache:1:throttle_anon_127.0.0.1", b"x"),
            lambda: job.keys("*"),
            lambda: job.get("cosched:log:1"),
            lambda: job.lpush("scheduler", "{}"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attack()
        anonymous = redis.Redis.from_url(
            compose.portal_url.replace(PASSWORDS["REDIS_PASSWORD"], "")
        )
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()


# --- configuration: no pickle anywhere --------------------------------------------------------


def test_no_pickle_is_accepted_anywhere():
    """The deployment's settings (REDIS_URL set, in a fresh process) and its Celery app: the
    cache serializes JSON and every Celery content type and serializer is signed JSON."""
    code = (
        "import json, django; django.setup()\n"
        "from django.conf import settings\n"
        "from portal.celery import app\n"
        "c = app.conf\n"
        "print(json.dumps({'caches': settings.CACHES, 'celery': {k: c[k] for k in ("
        "'accept_content', 'result_accept_content', 'task_serializer', 'result_serializer',"
        " 'event_serializer', 'task_protocol')}, 'task_cls': app.Task.__mro__[1].__name__}))\n"
    )
    env = {**os.environ, "REDIS_URL": LAB_URL, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "pickle" not in json.dumps(seen).lower()
    for cache in seen["caches"].values():
        assert cache["OPTIONS"]["serializer"] == "portal.core.cache.JSONSerializer"
    celery = seen["celery"]
    assert celery["accept_content"] == [SIGNED] and celery["result_accept_content"] == [SIGNED]
    for key in ("task_serializer", "result_serializer", "event_serializer"):
        assert celery[key] == signed_messages.NAME, key
    assert celery["task_protocol"] == 1  # the task's name inside the signed body
    assert seen["task_cls"] == "SignedTask"
    with pytest.raises(UnreadableValue):
        JSONSerializer().loads(pickle.dumps({"a": 1}))


def test_the_cache_serializer_reads_only_its_own_json():
    serializer = JSONSerializer()
    for value in ([1712000000.5, 1712000001.25], {"a": [1, "b"]}, "text", True, None, 2.5):
        assert serializer.loads(serializer.dumps(value)) == value
    assert serializer.dumps(7) == 7  # a Redis integer: incr stays atomic
    assert serializer.loads(b"7") == 7
    for garbage in (pickle.dumps([1.0]), b"\xff\xfe\x00", b"{not json", b""):
        with pytest.raises(UnreadableValue):
            serializer.loads(garbage)


# --- (a) a pickle in the rate limiter's cache -----------------------------------------------------


class _Payload:
    """Unpickling this creates ``path`` (any code could run the same way)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


@pytest.mark.django_db
def test_a_pickle_in_the_rate_limiters_key_runs_nothing(target, settings, client, tmp_path):
    settings.CACHES = {"default": redis_cache(target.portal_url)}
    from django.core.cache import cache

    cache.clear()
    # Anonymous, on an endpoint anyone may read: the anonymous rate limiter writes its key.
    response = client.get("/api/schema/")
    assert response.status_code == 200
    attacker = target.attacker()
    keys = [k.decode() for k in attacker.keys("cosched-cache:*throttle_anon*")]
    assert keys, "the anonymous rate limiter keeps no key in Redis: nothing to attack"
    marker = tmp_path / "pwned"
    poisons = [
        pickle.dumps(_Payload(marker)),  # code, were it unpickled
        b"\xff garbage",
        b'"a string"',  # JSON, but not a counter: INCR refuses it
        b'{"a": 1}',
        b'["x", 1]',
        b"12",  # a Redis integer
    ]
    for poison in poisons:
        for key in keys:
            attacker.set(key, poison)
        response = client.get("/api/schema/")
        assert response.status_code == 200, (poison, response.content)  # answered, not a 500
        assert not marker.exists(), "the cached pickle ran in the portal"
        # The poisoned value was not a counter: the limiter started a fresh window over it.
        for key in keys:
            count = json.loads(attacker.get(key))
            assert type(count) is int and count >= 1, (poison, count)


# --- (b) log tails ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_no_log_tail_is_readable_from_redis(target, settings, alice, node, agent):
    """A job's output reaches the portal through the agent sync and shows on its page; Redis
    (the metrics' latest store here) holds no trace of it."""
    settings.REDIS_URL = target.portal_url
    secret = f"api-key-{uuid.uuid4().hex}"
    job = _job(alice, node, f"echo {secret}; sleep 30")
    _step_until_tail = time.monotonic() + 20
    while secret not in (metrics.log_tail_get(job.pk) or ""):
        assert time.monotonic() < _step_until_tail, (
            "the log tail never reached the portal",
            agent.log_path(job.pk).read_text(),
            list(metrics.JobLogTail.objects.values()),
        )
        agent.step()
        time.sleep(0.05)
    attacker = target.attacker()
    assert not list(attacker.scan_iter(match="cosched:log:*"))
    for key in attacker.scan_iter():
        kind = attacker.type(key).decode()
        values = {
            "string": lambda k: [attacker.get(k)],
            "hash": lambda k: list(attacker.hgetall(k).values()),
            "list": lambda k: attacker.lrange(k, 0, -1),
            "set": lambda k: list(attacker.smembers(k)),
            "zset": lambda k: attacker.zrange(k, 0, -1),
        }.get(kind, lambda k: [])(key)
        assert not any(secret.encode() in (v or b"") for v in values), key


# --- (c) forged Celery messages -----------------------------------------------------------------


def _raw_message(body: bytes, content_type: str, headers: dict, queue: str) -> str:
    """A message as kombu's Redis transport stores it in the queue's list."""
    tag = str(uuid.uuid4())
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "binary" if "pickle" in content_type else "utf-8",
            "content-type": content_type,
            "headers": headers,
            "properties": {
                "correlation_id": headers.get("id", tag),
                "delivery_mode": 2,
                "delivery_info": {"exchange": queue, "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": tag,
            },
        }
    )


def _v2_headers(task: str) -> dict:
    task_id = str(uuid.uuid4())
    return {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "retries": 0}


def _wrongly_signed(obj: object) -> bytes:
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    import hashlib
    import hmac

    mac = hmac.new(b"a key the job guessed", payload.encode(), hashlib.sha256).hexdigest()
    return f"v1:{mac}:{payload}".encode()


def _v1_body(task: str, path: str) -> dict:
    return {"task": task, "id": str(uuid.uuid4()), "args": [path], "kwargs": {}, "retries": 0}


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_a_forged_celery_message_is_not_executed(target, settings, tmp_path):
    from portal.celery import app

    settings.CELERY_SIGNING_KEY = "attack-test-signing-key-" + "k" * 20
    queue = f"attack-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "REDIS_URL": target.portal_url,
        "COSCHED_CELERY_SIGNING_KEY": settings.CELERY_SIGNING_KEY,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "portal.celery",
                "worker",
                "-Q",
                queue,
                "-P",
                "solo",
                "-c",
                "1",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"{queue}@%h",
                "-I",
                "tests.security.celery_probe",
                "-l",
                "info",
            ],  # fmt: skip
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        attacker = target.attacker()
        files = {n: tmp_path / n for n in ("json", "wrong-key", "pickle", "renamed", "portal")}
        probe = "cosched.test_probe"
        # 1. plain JSON, protocol 2: what Celery accepts by default
        args = [[str(files["json"])], {}, {"callbacks": None, "errbacks": None, "chain": None}]
        forged = [
            _raw_message(json.dumps(args).encode(), "application/json", _v2_headers(probe), queue)
        ]
        # 2. our content type, signed with a key the job does not have
        body = _wrongly_signed(_v1_body(probe, str(files["wrong-key"])))
        forged.append(_raw_message(body, SIGNED, {}, queue))
        # 3. a pickle: its unpickling alone would create the file
        payload = pickle.dumps(_Payload(files["pickle"]))
        forged.append(
            _raw_message(payload, "application/x-python-serialize", _v2_headers(probe), queue)
        )
        # 4. a body the portal signed for a harmless task, delivered under the probe's name
        with app.connection_for_write(target.portal_url) as conn:
            app.send_task(
                "cosched.test_harmless", args=[str(files["renamed"])], queue=f"{queue}-x",
                connection=conn,
            )  # fmt: skip
        captured = json.loads(attacker.rpop(f"{queue}-x"))
        captured["headers"] = {"task": probe}  # headers are not signed
        captured["properties"]["delivery_info"] = {"exchange": queue, "routing_key": queue}
        forged.append(json.dumps(captured))
        for message in forged:
            attacker.lpush(queue, message)
        # 5. last, what the portal sends: it runs, so the forged ones before it were read
        with app.connection_for_write(target.portal_url) as conn:
            app.send_task(probe, args=[str(files["portal"])], queue=queue, connection=conn)
        deadline = time.monotonic() + 30
        while not files["portal"].exists():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        text = log.read_text()
        for name in ("json", "wrong-key", "pickle", "renamed"):
            assert not files[name].exists(), f"the forged message ({name}) ran:\n{text}"
        assert attacker.llen(queue) == 0  # read and dropped, not left for a later worker
    finally:
        worker.terminate()
        worker.wait(20)
