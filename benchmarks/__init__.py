"""Cosched benchmarks: ``python -m benchmarks [--quick] [NAME ...]``.

Each benchmark is a module in this package with one entry point::

    def run(quick: bool = False) -> dict: ...

It prints its own table and returns its figures. To put figures on the runner's one-screen
summary, a benchmark returns them under ``"summary"`` as ``{label: value}`` (value a number or a
short string, with the unit in the label); without that key the runner shows the result's
top-level numbers. Benchmarks are registered here as data (name -> dotted module path) and
imported only when they run, so one missing or broken module does not stop the others.
"""

from __future__ import annotations

BENCHMARKS: dict[str, str] = {
    "decision": "benchmarks.decision_latency",
    "sharing": "benchmarks.sharing_latency",
    "simulator": "benchmarks.simulator_throughput",
    "api": "benchmarks.api_latency",
    "live": "benchmarks.live_latency",
    "replay": "benchmarks.replay_throughput",
    "churn": "benchmarks.churn",
}
"""Registered benchmarks in the order the runner runs them."""

DESCRIPTIONS: dict[str, str] = {
    "decision": "scheduling-decision latency of each policy (pure core, no I/O)",
    "sharing": "decision latency of sharing_mode / kscheduler and kin on MIG, MPS, kernel jobs",
    "simulator": "simulator throughput on the named scenarios",
    "api": "REST API latency: POST and GET /api/v1/jobs/ against gunicorn + PostgreSQL",
    "live": "end-to-end submit -> RUNNING latency with Celery and virtual node agents",
    "replay": "what-if replay of 10,000 finished jobs from PostgreSQL under two policies",
    "churn": "hetero_srtf at 80,000 busy GPUs: cycle time, share requeued; 100,000-job replay",
}
