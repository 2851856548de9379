"""The shipped systemd unit and its environment file start the agent with flags it knows: the
unit's ExecStart, with the environment file's values put in, parses with the agent's own
command-line parser, and every COSCHED_* the file sets is one the agent or portal reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from workers.agent import _parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def _env(text: str) -> dict[str, str]:
    pairs = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def _exec_start(unit: str) -> str:
    joined = unit.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=")


def test_the_unit_starts_the_agent_with_flags_it_parses():
    unit = (DEPLOY / "cosched-agent.service").read_text()
    env = _env((DEPLOY / "agent.env").read_text())
    assert "EnvironmentFile=/etc/cosched/agent.env" in unit
    command = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], _exec_start(unit))
    argv = shlex.split(command)
    assert argv[1:3] == ["-m", "workers.agent"]
    opts = _parser().parse_args(argv[3:])
    assert (opts.name, opts.backend, opts.kind) == ("gpu-node-1", "nvml", "gpu")
    # The agent is restarted, and its jobs survive the restart (it adopts them).
    assert "Restart=always" in unit and "KillMode=process" in unit


def test_every_setting_in_the_environment_file_is_read_somewhere():
    root = Path(__file__).resolve().parents[2]
    sources = "\n".join(
        p.read_text() for d in ("workers", "portal") for p in (root / d).rglob("*.py")
    )
    unit = (DEPLOY / "cosched-agent.service").read_text()
    text = (DEPLOY / "agent.env").read_text()
    names = set(re.findall(r"^#?(COSCHED_\w+)=", text, flags=re.MULTILINE))
    assert len(names) >= 8
    for name in names:
        assert name in sources or "${" + name + "}" in unit, f"{name} is read by nothing"
