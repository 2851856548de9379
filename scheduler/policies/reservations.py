"""EASY reservations (the ``reserve`` parameter of the framework's policies).

With ``backfill`` on, as Slurm's backfill scheduler does: the first job in the policy's order
that asks more than one GPU, cannot be placed, and whose start can be predicted gets a
reservation: the earliest time enough GPUs are predicted idle (``WorkingView.release_times``:
the running jobs' predicted ends, the same estimates as the waiting reasons), and which GPUs
those are (on one node, the node predicted to have them first; for a gang, the GPUs free by
then on the fewest nodes, fullest first). Only jobs of more than one GPU get one: a one-GPU job
is first in line for the next GPU that frees and fits it, so backfill cannot starve it. A job
behind it in the order may then start on the reserved GPUs only if it is predicted to end
before the reservation's start (its profiled solo time on that model, spread if it is a gang,
bounded by its time limit; the time limit alone when nothing is profiled); a job whose run time
cannot be predicted, or that would end later, may start on other GPUs only. A reserved GPU that
is running jobs now takes no co-located job (it would slow the jobs whose ends the reservation
counts on). The reserved job's reason names the GPUs and the predicted start; a job kept off
the reserved GPUs says it would delay that reservation. One reservation per cycle, recomputed
every cycle from the snapshot (deterministic). Cores are not reserved: a later job may take
cores on a reserved node (the nodes of the traces have cores to spare; a node short of cores at
the start delays the reservation).

The cycle that holds the reservation and hides its GPUs is ``FrameworkPolicy.schedule``
(``scheduler.policies.framework``); this module computes the reservation and its texts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.domain import JobSpec
from scheduler.policies.candidate import WorkGpu
from scheduler.policies.explanations import duration_text
from scheduler.policies.working_view import WorkingView


@dataclass(slots=True, eq=False)
class Reservation:
    """The EASY reservation of one waiting job (``reserve``; see the module docstring).

    ``start_s``: seconds from now until every reserved GPU is predicted idle; ``sid``: the
    spec id of its GPUs (one model); ``gpus``: (node order, GPU index) of each, node rank
    order; ``work``: the view's ``WorkGpu`` of those that can take a job now (idle, or shared),
    which the view hides from jobs that would delay the reservation; ``until_job``: the job
    whose predicted end sets ``start_s``; ``label``: "v0/gpu0,1 + v1/gpu2,3".
    """

    job: JobSpec
    start_s: float
    sid: int
    model: str
    gpus: tuple[tuple[int, int], ...]
    work: tuple[WorkGpu, ...]
    until_job: str
    label: str

    @property
    def text(self) -> str:
        """ "8 V100 on v0/gpu0,1,2,3 + v1/gpu0,1,2,3, predicted idle in about 25 min, when
        job 812 is predicted to end"."""
        return (
            f"{len(self.gpus)} {self.model} on {self.label}, predicted idle in "
            f"{duration_text(self.start_s)}, when job {self.until_job} is predicted to end"
        )


def predicted_run_s(job: JobSpec, model: str, *, spread: bool, speed: float) -> float | None:
    """What the policy predicts ``job`` runs on ``model`` (s): its profiled solo time
    (spread over nodes: the unconsolidated time, else the solo time / ``speed``, the policy's
    ``unconsolidated_speed``), bounded by its time limit; the time limit alone when nothing is
    profiled; None when neither is known."""
    solo = job.run_time_s(model, spread=spread, speed=speed)
    if solo is None or not math.isfinite(solo):
        return job.time_limit_s
    if job.time_limit_s is not None:
        return min(solo, job.time_limit_s)
    return solo


def earliest_reservation(
    job: JobSpec, view: WorkingView, sids: Sequence[int], *, spread: bool, speed: float
) -> Reservation | None:
    """The earliest predicted start of ``job`` (more than one GPU) on the GPUs of spec ids
    ``sids`` (those it may use) and the GPUs it would get, or None when it cannot be predicted
    (busy GPUs without a predicted end) or the GPUs are idle now (the job waits for something
    else: cores, a policy's filter). ``spread``: the job is a gang (no node holds it);
    ``speed``: the policy's ``unconsolidated_speed``.

    On one node: the node of a usable spec whose ``job.gpus``-th GPU is predicted idle
    first (then cluster order). A gang: the time the ``job.gpus``-th GPU of a usable spec
    is predicted idle, on the nodes with the most GPUs idle by then (fewest nodes), then
    cluster order; each node's GPUs free first. Among specs, the earliest start, then the
    fewest nodes, then cluster order. Cost: O(GPUs of the usable specs x log)."""
    k, cpus = job.gpus, job.cpus
    best: tuple[tuple[float, int, int], int, list[tuple[float, str, int, int]]] | None = None
    for sid in sids:
        times = view.free_times(sid, cpus, speed)
        if len(times) < k:
            continue
        by_node: dict[int, list[tuple[float, str, int, int]]] = {}
        for entry in times:
            by_node.setdefault(entry[2], []).append(entry)
        picks: list[tuple[float, str, int, int]] = []
        if spread:
            times.sort()
            start = times[k - 1][0]
            ready = {
                n: sorted(e for e in entries if e[0] <= start) for n, entries in by_node.items()
            }
            for n in sorted(ready, key=lambda n: (-len(ready[n]), n)):
                picks.extend(ready[n][: k - len(picks)])
                if len(picks) >= k:
                    break
        else:
            found: tuple[float, int] | None = None
            for n, entries in by_node.items():
                if len(entries) < k or view.nodes[n].size_by_sid.get(sid, 0) < k:
                    continue
                entries.sort()
                if found is None or (entries[k - 1][0], n) < found:
                    found = (entries[k - 1][0], n)
            if found is None:
                continue
            picks = by_node[found[1]][:k]
        start = max(e[0] for e in picks)
        nodes = {e[2] for e in picks}
        key = (start, len(nodes), min(nodes))
        if best is None or key < best[0]:
            best = (key, sid, picks)
    if best is None or best[0][0] <= 0.0:
        return None
    (start, _, _), sid, picks = best
    per_node: dict[int, list[int]] = {}
    for _, _, n, idx in picks:
        per_node.setdefault(n, []).append(idx)
    ranked = sorted(per_node, key=lambda n: (-len(per_node[n]), n))
    gpus = tuple((n, idx) for n in ranked for idx in sorted(per_node[n]))
    wanted = set(gpus)
    work = tuple(g for n in ranked for g in view.nodes[n].gpus if (n, g.index) in wanted)
    label = " + ".join(
        f"{view.nodes[n].name}/gpu" + ",".join(str(i) for i in sorted(per_node[n])) for n in ranked
    )
    until = max(picks)[1]
    return Reservation(job, start, sid, view.specs[sid].model, gpus, work, until, label)


def delay_text(job: JobSpec, held: Reservation, run: float | None) -> str:
    """Why ``job`` (predicted to run ``run`` seconds on the reserved model, None: unknown)
    does not start on GPUs reserved for another job."""
    if run is None:
        why = (
            f"its run time cannot be predicted (no profiled time on {held.model} and no time limit)"
        )
    else:
        why = f"it is predicted to run {duration_text(run)}"
    return (
        f"would delay job {held.job.id}'s reservation ({held.text}): it fits now only on "
        f"those GPUs, and {why}"
    )
