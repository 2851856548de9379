"""The node agent: runs the attempts the portal wants on one node (DESIGN.md, Node agent;
docs/reliability.md).

    python -m workers.agent --name gpu-1 --portal https://cosched.example.org \\
        --token-file /etc/cosched/gpu-1.token --backend nvml [--nudge-url redis://host:6379/0]

It speaks only ``workers.protocol`` (no Django, no database credentials). One loop:

1. **collect**: runners that ended have written ``result.json``; those become results in the
   agent's outbox (they stay on disk until the portal acknowledges them);
2. **sync** (``Transport.sync``): report the attempts it runs, the results, the attempts it was
   told run here but does not know, metric samples and log tails; the reply renews the lease
   (written to the lease file its runners read) and lists the desired attempts;
3. **reconcile**: start every desired attempt it may launch and does not run (each under a
   ``workers.runner`` process in its own session, the job's parent), stop every attempt it runs
   that is not desired any more (cancelled, requeued, superseded), SIGSTOP / SIGCONT the ones
   whose pause flag changed. After a launch it syncs again at once, so the job is RUNNING in the
   database a few milliseconds after the process started.

It loops every ``--interval`` seconds (default: the portal's ``COSCHED_SYNC_INTERVAL_S``), at
once when the portal nudges it (Redis pub/sub, ``--nudge-url``; optional: without nudges it is
only slower) and when a runner says its job ended (a byte into ``wake.fifo``). Metric samples
are taken every ``--sample-every`` seconds in between and ride on the next periodic sync.

A runner whose result the agent does not collect in time (the agent frozen or dead) reports it
to the portal itself with the node's token file (``workers.runner``), so a job that finished
meanwhile is not run again when the node's lease runs out.

**Local state** (``<data>/agent/<node>/``, mode 0700, locked by the one agent using it):
``lease.json``, ``seq.json`` (the order of its requests), ``wake.fifo`` and one directory per
attempt (``attempts/<job>-<attempt>/``, see ``workers.runner``). On start the agent re-adopts
the runners still alive, turns the finished ones into results, kills the job processes of a
runner that died without a result, and kills every other process carrying its marker
(``COSCHED_AGENT_ID``). The next sync reports all that; the portal replies which attempts are
still desired, and the others are stopped.

**Lease**: a reply's lease counts from when the request was *sent*; the runners stop their jobs
when it runs out (agent dead, frozen, or cut off from the portal). Stopping the agent (SIGTERM)
leaves the jobs running: an upgrade must not kill hours of training; a new agent adopts them.

The embedded default (``manage.py run_embedded``) runs ``NodeAgent`` objects in-process with
``portal.core.agent_sync.InProcessTransport``: the same messages, no HTTP.

**Where it lives** (one idea a module): ``node`` (``NodeAgent``: local state, the loop, the sync
and the reconciliation), ``launch`` (starting an attempt: environment, isolation, container,
runner), ``supervise`` (pause, stop, collecting results and logs), ``metrics`` (samples),
``attempt`` (what the agent keeps of one attempt), ``logs``, ``envs`` (launcher variables),
``devices`` (GPUs and their device nodes), ``processes`` (the agent's marker and leftovers),
``transport`` (HTTP and nudges) and ``cli`` (``python -m workers.agent``). This package
re-exports their public names.
"""

from __future__ import annotations

from workers.agent.attempt import LocalAttempt
from workers.agent.cli import UsageError, _parser, main
from workers.agent.devices import device_row, gpu_device_nodes, gpu_devices_for
from workers.agent.envs import (
    RUNNER_ENV_KEEP,
    gang_env,
    master_port,
    process_gpus,
    rank_envs,
    runner_env,
)
from workers.agent.launch import ATTEMPT_DIR_ENV, CHECKPOINT_DIR_ENV, ROOT, TIME_LIMIT_ENV
from workers.agent.logs import (
    LOG_CHUNK_BYTES,
    LOG_CHUNKS_PER_SYNC,
    LOG_TAIL_BYTES,
    describe,
    read_log_chunks,
)
from workers.agent.metrics import MAX_BUFFERED_SAMPLES
from workers.agent.node import FOLLOW_UP_SYNCS, AgentLocked, NodeAgent
from workers.agent.processes import MARKER_ENV, kill_marked_processes, marker_for
from workers.agent.supervise import KILL_GRACE_S
from workers.agent.transport import HttpTransport, NudgeListener

__all__ = [
    "ATTEMPT_DIR_ENV",
    "AgentLocked",
    "CHECKPOINT_DIR_ENV",
    "FOLLOW_UP_SYNCS",
    "HttpTransport",
    "KILL_GRACE_S",
    "LOG_CHUNKS_PER_SYNC",
    "LOG_CHUNK_BYTES",
    "LOG_TAIL_BYTES",
    "LocalAttempt",
    "MARKER_ENV",
    "MAX_BUFFERED_SAMPLES",
    "NodeAgent",
    "NudgeListener",
    "ROOT",
    "RUNNER_ENV_KEEP",
    "TIME_LIMIT_ENV",
    "UsageError",
    "_parser",
    "describe",
    "device_row",
    "gang_env",
    "gpu_device_nodes",
    "gpu_devices_for",
    "kill_marked_processes",
    "main",
    "marker_for",
    "master_port",
    "process_gpus",
    "rank_envs",
    "read_log_chunks",
    "runner_env",
]
