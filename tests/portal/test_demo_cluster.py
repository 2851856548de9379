"""The demo stays alive and uses the whole cluster (issue 18, part 6): ``load_demo``'s cluster
and jobs plus the arrival stream of ``run_embedded --arrivals-per-minute`` (what ``make demo``
runs), time-compressed (profile times x 0.02, two arrivals a second) so the test is short: both
GPU nodes and the CPU node run jobs to completion, and jobs keep arriving."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from portal.core.demo import CPU_APPS, ArrivalStream
from portal.core.models import Job, Placement
from tests.e2e.conftest import wait_for
from tests.embedded import embedded_loop

SCALE = 0.02


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _completed_nodes() -> set[str]:
    return set(
        Placement.objects.filter(job__state="COMPLETED").values_list("node__name", flat=True)
    )


# Among the heaviest live tests: in `make test-slow` (CI runs it after `make test`).
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demo_runs_jobs_on_every_node_and_keeps_getting_arrivals(settings, tmp_path):
    call_command("load_demo", "--emulate-scale", str(SCALE), stdout=StringIO())
    stream = ArrivalStream(120, scale=SCALE, seed=7, max_queued=20)
    with embedded_loop(settings, tmp_path / "logs", arrivals=stream):
        wait_for(
            lambda: _completed_nodes() == {"gpu-titanxp-1", "gpu-a30-1", "cpu-1"},
            45,
            interval=0.5,
            what="jobs completed on both GPU nodes and the CPU node",
        )
        first = stream.submitted
        wait_for(
            lambda: stream.submitted >= first + 5,
            15,
            interval=0.5,
            what="more arrivals",
        )
    arrivals = Job.objects.filter(params__scenario="arrivals")
    assert arrivals.count() == stream.submitted >= 5
    assert arrivals.filter(state="COMPLETED").exists()
    assert not Job.objects.filter(state="FAILED").exists(), list(
        Job.objects.filter(state="FAILED").values_list("name", "failure_reason")
    )
    # the arrivals ran on the GPU nodes as well as the CPU node
    arrival_nodes = set(
        Placement.objects.filter(job__in=arrivals).values_list("node__name", flat=True)
    )
    assert "cpu-1" in arrival_nodes and arrival_nodes & {"gpu-titanxp-1", "gpu-a30-1"}


@pytest.mark.django_db
def test_arrivals_are_poisson_seeded_capped_and_partly_cpu_only():
    call_command("load_demo", "--no-jobs", stdout=StringIO())
    clock = _Clock()
    stream = ArrivalStream(1, scale=0.5, seed=3, max_queued=1000, clock=clock)
    assert stream.step() == 0  # nothing due at the start
    clock.now = 600.0  # ten minutes at one a minute
    submitted = stream.step()
    assert 3 <= submitted <= 20, submitted  # Poisson, mean 10: far outside only if broken
    jobs = Job.objects.filter(owner__username="demo", params__scenario="arrivals")
    assert jobs.count() == submitted == stream.submitted
    assert all(j.command.endswith("--scale 0.5") for j in jobs)
    cpu_only = jobs.filter(gpus=0)
    assert cpu_only.exists() and jobs.filter(gpus=1).exists()
    assert set(cpu_only.values_list("profile__name", flat=True)) <= set(CPU_APPS)

    # the same seed gives the same sequence
    call_command("load_demo", "--no-jobs", stdout=StringIO())
    later = _Clock()
    again = ArrivalStream(1, scale=0.5, seed=3, max_queued=1000, clock=later)
    later.now = 600.0
    assert again.step() == submitted

    # while the demo user has max_queued jobs waiting, arrivals are skipped
    capped = ArrivalStream(1, seed=4, max_queued=3, clock=clock)
    clock.now += 600.0
    assert capped.step() == 0 and capped.skipped > 0  # the two runs' jobs are all queued


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="per minute"):
        ArrivalStream(0)
    with pytest.raises(ValueError, match="max_queued"):
        ArrivalStream(1, max_queued=0)
    with pytest.raises(ValueError, match="cpu_only_share"):
        ArrivalStream(1, cpu_only_share=1.5)
