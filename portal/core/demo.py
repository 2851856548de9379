"""The demo's steady stream of arrivals (issue 18, part 6), so the dashboard keeps moving for
anyone who opens it, long after ``load_demo``'s 25 jobs have finished.

``ArrivalStream.step()`` is called by the embedded loop (``manage.py run_embedded
--arrivals-per-minute N``; ``make demo`` turns it on). Arrivals are a Poisson process of rate N
per minute (exponential gaps from a seeded generator, so two runs with one seed submit the same
sequence); each arrival is a job of the demo user under the job emulator with ``--scale``.
A share ``cpu_only_share`` of them (default 0.25: the first arrival, then one in four) are
CPU-only runs (no GPU asked) of one of seed 004's HPC codes that have a CPU time (``CPU_APPS``:
users who know their code is fine on a CPU); the others are 1-GPU jobs of ``ARRIVAL_APPS`` (the
policy may still send seed 004's applications to the CPU node when the GPUs are busy). The
application is drawn uniformly among those whose profile is approved. Without the CPU-only
share the CPU node would idle whenever the four GPUs have room: the right choice of the
policy, but a dull demo of a three-node cluster.

While the demo user already has ``max_queued`` jobs waiting, arrivals are skipped (and
counted): a demo left open for a day does not build a queue of thousands.
"""

from __future__ import annotations

import logging
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model

from portal.core import services
from portal.core.models import ApplicationProfile, Job
from portal.core.states import JobState

log = logging.getLogger(__name__)

#: The applications arrivals run: seed 004's five (their placement rates send some to the CPU
#: node) and seed 001's ten models (GPU only). Each needs a run time on the GPU models it may
#: land on, which ``load_demo`` gives every one of them (measured, assumed or estimated).
ARRIVAL_APPS = (
    "CNN-MNIST",
    "BlackScholes",
    "Binomial",
    "LAMMPS",
    "GROMACS",
    "ResNet50-train",
    "ResNet50-inference",
    "VGG16-train",
    "VGG16-inference",
    "GoogLeNet-train",
    "GoogLeNet-inference",
    "EfficientNet-train",
    "EfficientNet-inference",
    "YOLOv5-train",
    "YOLOv5-inference",
)

#: Seed 004's HPC codes with a CPU time: the CPU-only share of arrivals runs these.
CPU_APPS = ("BlackScholes", "Binomial", "GROMACS")


@dataclass
class ArrivalStream:
    """Submits the demo's arrivals as they fall due (see the module docstring)."""

    per_minute: float
    scale: float | None = None
    username: str = "demo"
    max_queued: int = 20
    cpu_only_share: float = 0.25
    seed: int | None = None
    clock: Callable[[], float] = time.monotonic
    submitted: int = 0
    skipped: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _next_at: float = field(init=False, repr=False)
    _run: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.per_minute <= 0:
            raise ValueError("arrivals per minute must be positive")
        if self.max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        if not 0 <= self.cpu_only_share <= 1:
            raise ValueError("cpu_only_share must be within 0..1")
        self._rng = random.Random(self.seed)  # noqa: S311  (a demo's arrivals, not security)
        self._run = uuid.uuid4().hex[:8]
        self._next_at = self.clock() + self._gap()

    def _gap(self) -> float:
        return self._rng.expovariate(self.per_minute / 60.0)

    def step(self) -> int:
        """Submit every arrival due by now; returns how many were submitted."""
        now = self.clock()
        if now < self._next_at:
            return 0
        owner = get_user_model().objects.filter(username=self.username).first()
        profiles = {
            p.name: p
            for p in ApplicationProfile.objects.filter(
                name__in=ARRIVAL_APPS + CPU_APPS,
                version="1",
                status=ApplicationProfile.Status.APPROVED,
            )
        }
        apps = [name for name in ARRIVAL_APPS if name in profiles]
        cpu_apps = [name for name in CPU_APPS if name in profiles]
        count = 0
        while now >= self._next_at:
            self._next_at += self._gap()
            if owner is None or not apps:
                self.skipped += 1
                continue
            queued = Job.objects.filter(owner=owner, state=JobState.PENDING).count()
            if queued >= self.max_queued:
                self.skipped += 1
                continue
            n = self.submitted + 1  # this arrival's number: CPU-only where the share ticks
            share = self.cpu_only_share
            if cpu_apps and math.ceil(n * share - 1e-9) > math.ceil((n - 1) * share - 1e-9):
                self._submit(owner, profiles[self._rng.choice(cpu_apps)], gpus=0)
            else:
                self._submit(owner, profiles[self._rng.choice(apps)], gpus=1)
            count += 1
        if owner is None or not apps:
            log.warning("demo arrivals: no user %r or no demo profiles (load_demo)", self.username)
        return count

    def _submit(self, owner: Any, profile: ApplicationProfile, *, gpus: int) -> None:
        self.submitted += 1
        suffix = f" --scale {self.scale:g}" if self.scale else ""
        services.job_submit(
            owner,
            idempotency_key=f"demo-arrival:{self._run}:{self.submitted}",
            name=f"{profile.name}-{'cpu-' if gpus == 0 else ''}a{self.submitted}",
            command=f"python -m workers.emulate --profile {profile.name}{suffix}",
            profile=profile,
            gpus=gpus,
            cpus=1,
            params={"scenario": "arrivals"},
        )
