"""The framework's default filter: which placements a job may get, and why none when none.

``FrameworkPolicy.candidates`` (``scheduler.policies.framework``) calls these functions by the
job's kind (CPU, one GPU, several GPUs on one node; a gang is ``scheduler.policies.gangs``), then
keeps the candidates that honour what the job asked (``honour_request``). When none is left the
job's waiting reason comes from ``request_refusal`` or ``no_fit_reason``, with the numbers that
matter. Candidates are listed in cluster order, so a refreshed view and a fresh one give the same
plan.

Feasibility rules (all policies built on ``FrameworkPolicy``):

- Nodes that are not ``up`` get nothing.
- CPU-only jobs (``gpus == 0``) go to CPU nodes with ``free_cores >= job.cpus``.
- GPU jobs need ``job.cpus`` free cores on the GPU node too (nodes with ``cores == 0`` do not
  track cores and are not checked).
- A job needs ``job.memory_need_mb()`` free on each GPU it gets (spec memory minus the memory
  committed to the jobs already placed there).
- If the job's profile lists solo times per GPU model (``gpu_time_s``), only those models with a
  positive, finite time are feasible (``profiled_models_only``; an unprofiled model has no
  run time to simulate).
- A GPU running jobs under EXCLUSIVE (or with no mode recorded) takes no more jobs. Under MPS or
  TIME_SLICING it takes up to ``max_jobs_per_gpu`` jobs, all under that mode (under MPS only
  jobs of the residents' owner: one MPS server serves one unix user); under MIG a job
  takes the smallest instance profile whose memory covers its need and whose compute slices are
  still free (``mig_total_slices - mig_slices_used``).
- An idle GPU gets the policy's fresh mode: EXCLUSIVE for exclusive policies; for co-locating
  ones ``share_mode`` if the GPU supports it, else its best sharing mode (MPS if supported,
  else time-slicing), so later jobs can join it.
- Multi-GPU jobs always take whole idle GPUs of one model on one node, exclusively: data-parallel
  jobs stall on their slowest worker, and the measured co-location data are single-GPU.
- **Gangs** (a job larger than any node): ``scheduler.policies.gangs``.
  end").
- A shared GPU is no candidate when the ``colocation_check`` predicts an infinite slowdown
  (the pair cannot co-run at all, e.g. Gavel measured it out of memory) for the job next to the
  residents, or for a resident next to the job. By default (``"knowledge"``,
  ``KnowledgeCheck``) the cluster's knowledge answers from its pair prior (a pair measured
  offline as infeasible, never seen running here); a named ``scheduler.interference`` model
  may answer instead. Otherwise a
  co-locating policy would place the job there, the co-run would be killed at once (an OOM),
  the job requeued and placed there again: an OOM cascade. The waiting reason names the pair.
- A shared GPU is no candidate for a job that was OOM-killed beside a job of one of its
  residents' types, or whose resident was killed beside the job's type (``JobSpec.oom_with``:
  what a job was observed to die beside, filled by the simulator at a requeue): the pair is
  not tried again, whatever a model predicts.
- With ``backfill`` off, the first job that cannot be placed blocks the rest of the queue.
- **Reservations** (``reserve``): ``scheduler.policies.reservations``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.domain import (
    SHARING_ALLOWED,
    SHARING_NEVER,
    GpuSpec,
    JobSpec,
    KnowledgeView,
    MigProfile,
    NodeKind,
    SharingMode,
)
from scheduler.interference import InterferenceModel
from scheduler.policies.candidate import Candidate, WorkGpu, job_type_key, spare_cores
from scheduler.policies.explanations import gb
from scheduler.policies.working_view import WorkingView

_SHARED_MODES = (SharingMode.MPS, SharingMode.TIME_SLICING)


def oom_beside(job: JobSpec, residents: Sequence[str], shunned: frozenset[str]) -> str | None:
    """Why ``job`` may not join a shared GPU whose residents have the types ``residents`` and
    were OOM-killed beside the types ``shunned`` (a shared pool key's last two entries), or
    None: it was killed beside one of those residents' types, or one of them beside its type
    (``JobSpec.oom_with``)."""
    if job.oom_with and not job.oom_with.isdisjoint(residents):
        return " + ".join(sorted(job.oom_with.intersection(residents)))
    own = job_type_key(job)
    if own in shunned:
        return f"a resident killed beside {own}"
    return None


def cpu_candidates(job: JobSpec, view: WorkingView, *, on_gpu_nodes: bool) -> list[Candidate]:
    """CPU nodes with the cores, in cluster order; for a job asking no GPU and with
    ``on_gpu_nodes`` (``cpu_jobs_on_gpu_nodes``), then the GPU nodes' spare cores."""
    out = [
        Candidate(node, (), SharingMode.EXCLUSIVE)
        for node in view.cpu_nodes
        if node.up and not node.barred and node.free_cores >= job.cpus
    ]
    if job.gpus <= 0 and on_gpu_nodes:
        # GPU nodes' spare cores, after the CPU nodes on equal scores: what is left after
        # one core for each of its idle GPUs (a node that does not count its cores,
        # cores <= 0, takes no CPU job: nothing would bound them).
        for node in view.nodes:
            if node.kind == NodeKind.CPU or not node.up or node.cores <= 0:
                continue
            if spare_cores(node) >= job.cpus:
                cand = Candidate(node, (), SharingMode.EXCLUSIVE)
                cand._rank = (1, 0, cand.order)
                out.append(cand)
    return out


def multi_gpu_candidates(
    job: JobSpec, view: WorkingView, allowed: frozenset[str] | None
) -> list[Candidate]:
    """``job.gpus`` whole idle GPUs of one model (``allowed``: the models it may run on, None:
    any) on one node, exclusive: one candidate per (spec, idle count), cluster order."""
    k, need = job.gpus, job.memory_need_mb()
    out: list[Candidate] = []
    for sid, buckets in view.idle_buckets.items():
        spec = view.specs[sid]
        if spec.memory_mb < need or (allowed is not None and spec.model not in allowed):
            continue
        counts = sorted(c for c, nodes in buckets.items() if c >= k and nodes)
        for count in counts:
            # One candidate per (spec, idle count): the first node in order with the cores.
            node = view.first_node_with_idle(sid, count, job.cpus)
            if node is not None:
                gpus = view.usable_idle(node, sid)[:k]
                out.append(Candidate(node, gpus, SharingMode.EXCLUSIVE))
    out.sort(key=lambda c: c.order)  # cluster order, whatever the indexes' history
    return out


def single_gpu_candidates(
    job: JobSpec,
    view: WorkingView,
    allowed: frozenset[str] | None,
    fresh_mode: Callable[[GpuSpec], SharingMode],
    *,
    colocate: bool,
    max_jobs_per_gpu: int,
    colocation_check: InterferenceModel | None,
) -> list[Candidate]:
    """One candidate per pool of equivalent GPUs: the idle pools (under ``fresh_mode(spec)``),
    then with ``colocate`` the shared pools the job may join (below ``max_jobs_per_gpu``, its
    memory free, the residents' owner under MPS, no OOM seen beside them, and a finite predicted
    slowdown under ``colocation_check``). The shared pools it was refused for land in
    ``view.co_run_rejected`` and ``view.oom_rejected`` (the waiting reason quotes them)."""
    need, cpus = job.memory_need_mb(), job.cpus
    out: list[Candidate] = []
    for sid, pool in view.idle_pools.items():
        spec = view.specs[sid]
        if not pool or spec.memory_mb < need:
            continue
        if allowed is not None and spec.model not in allowed:
            continue
        mode = fresh_mode(spec)
        mig = None
        if mode == SharingMode.MIG:
            mig = _smallest_mig_profile(spec, need, spec.mig_total_slices)
            if mig is None:
                continue
        gpu = view.first_with_cores(pool, cpus)
        if gpu is not None:
            out.append(Candidate(gpu.node, (gpu,), mode, mig, pool))
    # Candidates in cluster order (idle GPUs first, then shared ones), whatever the order
    # the pools were created in: the same snapshot gives the same list.
    out.sort(key=lambda c: c.order)
    if not colocate:
        return out
    shared: list[Candidate] = []
    rejected: list[tuple[int, int, str]] = []
    oom_rejected: list[tuple[int, int, str]] = []
    limit = max_jobs_per_gpu
    for key, pool in view.shared_pools.items():
        sid, mode, residents, committed, _mig_used, owners, shunned = key
        spec = view.specs[sid]
        if allowed is not None and spec.model not in allowed:
            continue
        if owners is not None and owners != (job.owner,):
            continue  # another user's MPS server holds the GPU
        mig = None
        if mode == SharingMode.MIG:
            mig = _smallest_mig_profile(spec, need, pool[0].free_mig_slices())
            if mig is None:
                continue
        elif len(residents) >= limit or spec.memory_mb - committed < need:
            continue
        seen = oom_beside(job, residents, shunned)
        if seen is not None:
            oom_rejected.append((pool[0].order, len(pool), f"{seen} on {spec.model}"))
            continue
        if not co_run_ok(job, key, pool[0], view, colocation_check):
            pair = f"{job_type_key(job)} with {' + '.join(residents)} on {spec.model}"
            rejected.append((pool[0].order, len(pool), pair))
            continue
        gpu = view.first_with_cores(pool, cpus)
        if gpu is not None:
            shared.append(Candidate(gpu.node, (gpu,), mode, mig, pool))
    shared.sort(key=lambda c: c.order)
    rejected.sort()
    oom_rejected.sort()
    view.co_run_rejected = [(n, pair) for _, n, pair in rejected]
    view.oom_rejected = [(n, beside) for _, n, beside in oom_rejected]
    return out + shared


class KnowledgeCheck:
    """The ``colocation_check`` ``"knowledge"``: asks ``KnowledgeView.co_run_possible`` (the
    cluster's pair prior, refined by co-runs it has seen) whether a pair can co-run at all, as
    an interference model whose slowdown is infinite for an impossible pair and 1 otherwise
    (only finiteness is read). ``knowledge`` is the snapshot's, else a knowledge with the
    Gavel table as its prior (``scheduler.knowledge.priors.table_pair_prior``)."""

    name = "knowledge (pair prior)"

    def __init__(self, knowledge: KnowledgeView) -> None:
        self.knowledge = knowledge

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        if not co_runners or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            return 1.0
        possible = self.knowledge.co_run_possible(job, gpu.model, co_runners, mode)
        return 1.0 if possible else math.inf


@functools.cache
def table_knowledge() -> KnowledgeView:
    """A knowledge holding only the Gavel table as its pair prior and no observations, made
    once per process (it is only read; its answers depend on the job types alone and are
    cached): what a policy handed no ``ClusterState.knowledge`` asks (the filter's check,
    ``hetero_srtf``'s pair speeds). The live side builds a policy per cycle, which would
    otherwise load the table and estimate every pair again each time."""
    from scheduler.knowledge import Knowledge
    from scheduler.knowledge.priors import table_pair_prior

    return Knowledge(pair_prior=table_pair_prior())


def co_run_ok(
    job: JobSpec,
    key: tuple[Any, ...],
    gpu: WorkGpu,
    view: WorkingView,
    model: InterferenceModel | None,
) -> bool:
    """Whether ``job`` may join the residents of the shared pool ``key`` (``gpu`` is one of
    its GPUs): no infinite predicted slowdown for it or for any resident. Cached per cycle
    by job type and pool key; residents of one pool have the same job types."""
    if model is None or not gpu.jobs:
        return True
    # (job type, spec id, mode, resident types): the model's inputs, so the answer holds
    # across cycles as long as the view (and its spec ids) lives.
    cache_key = (job_type_key(job), key[0], key[1], key[2])
    ok = view.co_run_ok.get(cache_key)
    if ok is None:
        residents = gpu.jobs
        mode = gpu.mode or SharingMode.MPS
        ok = math.isfinite(model.slowdown(job, residents, gpu.spec, mode))
        for i, resident in enumerate(residents):
            if not ok:
                break
            others = [*residents[:i], *residents[i + 1 :], job]
            ok = math.isfinite(model.slowdown(resident, others, gpu.spec, mode))
        view.co_run_ok[cache_key] = ok
    return ok


def honour_request(job: JobSpec, cands: list[Candidate]) -> list[Candidate]:
    """The candidates that honour what the job asked (docs/jobs.md), for every policy:

    - a job asking host memory (``memory_mb``) only on nodes with that much free (where
      nodes track it; the first GPU of a pool stands for the pool, as for cores);
    - a GPU job that may not run on a CPU node (``allow_cpu`` off) gets no CPU candidate;
    - a job that may not share (``JobSpec.whole_gpu_reason``: ``sharing: never``, or its
      GPU memory is unknown) gets no GPU with residents, and an idle GPU under EXCLUSIVE
      (a fresh sharing mode would let others join it);
    - ``sharing: mps`` / ``time_slicing`` joins only GPUs under that mode, and an idle GPU
      starts under it where the GPU supports it (else exclusive); a MIG profile name joins
      only instances of that profile, and an idle GPU otherwise runs it whole, exclusive.
    """
    if job.memory_mb > 0:  # host memory, reserved per node (docs/jobs.md)
        cands = [
            c
            for c in cands
            if all(
                node.free_memory_mb is None or node.free_memory_mb >= job.memory_mb
                for node, _ in c.parts
            )
        ]
    if job.gpus <= 0:
        return cands
    out: list[Candidate] = []
    shares = job.may_share()
    wanted = job.sharing
    for c in cands:
        if not c.gpus:
            if job.allow_cpu:
                out.append(c)
            continue
        if c.residents:
            if not shares or not _mode_matches(c, wanted):
                continue
        elif not shares or not _mode_matches(c, wanted):
            _make_fresh(c, wanted if shares else SHARING_NEVER)
        out.append(c)
    return out


def request_refusal(job: JobSpec, fitting: list[Candidate]) -> str:
    """Why every placement that fits ``job`` breaks what it asked (``honour_request``
    left none): its host memory, its own GPUs, or its device."""
    parts = [node for c in fitting for node, _ in c.parts]
    tracked = [n.free_memory_mb for n in parts if n.free_memory_mb is not None]
    if job.memory_mb > 0 and tracked and max(tracked) < job.memory_mb:
        return (
            f"needs {job.memory_mb:.0f} MB of host memory on a node: at most "
            f"{max(tracked):.0f} MB free on the {len(fitting)} placement(s) that fit "
            "otherwise"
        )
    gpu = [c for c in fitting if c.gpus]
    if job.gpus > 0 and not gpu:
        return (
            f"device gpu: it runs on GPUs only, and the {len(fitting)} placement(s) that "
            "fit are on CPU nodes (device auto allows them)"
        )
    if not job.may_share():  # the waiting reason then says why (``request_text``)
        return f"no idle GPU fits; the {len(gpu)} shared GPU(s) with room are not for it"
    return (
        f"the {len(gpu)} placement(s) that fit are not in the mode it asked "
        f"(sharing: {job.sharing})"
    )


def no_fit_reason(
    job: JobSpec,
    view: WorkingView,
    allowed: frozenset[str] | None,
    *,
    on_gpu_nodes: bool,
    colocate: bool,
    max_jobs_per_gpu: int,
    check_name: str,
) -> str:
    """Why ``job`` has no candidate, with the numbers that matter. ``allowed``: the models it
    may run on (None: any); ``on_gpu_nodes``: ``cpu_jobs_on_gpu_nodes``; ``check_name``: the
    ``colocation_check`` model's name. A gang's reason is ``gangs.gang_wait_reason`` (the caller
    asks it first: ``FrameworkPolicy.no_fit_reason``)."""
    need = job.memory_need_mb()
    only = f" (profiled models: {', '.join(sorted(allowed))})" if allowed is not None else ""
    if job.gpus <= 0:
        up = [n for n in view.cpu_nodes if n.up]
        where = "CPU nodes"
        if on_gpu_nodes:
            up += [n for n in view.nodes if n.kind != NodeKind.CPU and n.up and n.cores > 0]
            where = "nodes"
        if not up:
            return "CPU job: no CPU node is up"
        most = max(up, key=spare_cores)
        return (
            f"CPU job needs {job.cpus} free cores: most free is {spare_cores(most)} on "
            f"{most.name} ({len(up)} {where} up)"
        )
    if view.gpu_count == 0:
        return "no GPU in the cluster"
    if job.gpus > 1:
        best = 0
        for sid, buckets in view.idle_buckets.items():
            spec = view.specs[sid]
            if spec.memory_mb >= need and (allowed is None or spec.model in allowed):
                best = max([best, *(c for c, nodes in buckets.items() if nodes)])
        return (
            f"needs {job.gpus} idle GPUs with {gb(need)} GB on one node{only}: "
            f"at most {best} fit on any node now"
        )
    idle = sum(len(p) for s, p in view.spec_pools() if allowed is None or s.model in allowed)
    fitting_idle = sum(
        len(p)
        for s, p in view.spec_pools()
        if s.memory_mb >= need and (allowed is None or s.model in allowed)
    )
    if fitting_idle:
        return (
            f"{fitting_idle} idle GPUs could hold {gb(need)} GB{only} but none on a node "
            f"with {job.cpus} free cores"
        )
    text = f"no idle GPU with {gb(need)} GB{only} ({idle} idle GPUs, all too small)"
    if idle == 0:
        needs = f"; it needs {gb(need)} GB" if job.memory_known() else ""
        text = f"no idle GPU{only} (all {view.gpu_count} busy or down{needs})"
    if colocate:
        most_free = max(
            (
                view.specs[key[0]].memory_mb - key[3]
                for key in view.shared_pools
                if key[1] in _SHARED_MODES
                and len(key[2]) < max_jobs_per_gpu
                and (allowed is None or view.specs[key[0]].model in allowed)
            ),
            default=None,
        )
        if most_free is None:
            text += "; no shared GPU below its job limit"
        else:
            text += f"; most free on a shared GPU below its job limit: {gb(most_free)} GB"
        rejected = view.co_run_rejected if job.gpus == 1 else []
        if rejected:
            gpus = sum(n for n, _ in rejected)
            text += (
                f"; {gpus} shared GPU(s) with room rejected because the pair cannot co-run "
                f"({check_name} interference: infeasible, e.g. {rejected[0][1]})"
            )
        oom_rejected = view.oom_rejected if job.gpus == 1 else []
        if oom_rejected:
            gpus = sum(n for n, _ in oom_rejected)
            text += (
                f"; {gpus} shared GPU(s) with room skipped: this job was OOM-killed beside "
                f"their jobs' type before, or theirs beside its type (e.g. "
                f"{oom_rejected[0][1]})"
            )
        other_users = sum(
            len(pool)
            for key, pool in view.shared_pools.items()
            if key[5] is not None and key[5] != (job.owner,)
        )
        if other_users and job.gpus == 1:
            text += (
                f"; {other_users} MPS GPU(s) serve another user's jobs (MPS serves one "
                "user per GPU)"
            )
        mig_free = [
            view.specs[key[0]].mig_total_slices - key[4]
            for key in view.shared_pools
            if key[1] == SharingMode.MIG
        ]
        if mig_free:
            text += (
                f"; no MIG instance of {gb(need)} GB fits "
                f"(at most {max(mig_free)} free compute slices on a MIG GPU)"
            )
    return text


def _mode_matches(cand: Candidate, wanted: str) -> bool:
    """Whether ``cand``'s mode is one a job asking ``sharing: wanted`` accepts."""
    if wanted == SHARING_ALLOWED:
        return True
    if wanted in (SharingMode.MPS.value, SharingMode.TIME_SLICING.value):
        return cand.mode == SharingMode(wanted)
    if wanted == SHARING_NEVER:
        return cand.mode == SharingMode.EXCLUSIVE
    return cand.mode == SharingMode.MIG and (
        cand.mig_profile is not None and cand.mig_profile.name == wanted
    )


def _make_fresh(cand: Candidate, wanted: str) -> None:
    """Start ``cand``'s idle GPU(s) under the mode ``sharing: wanted`` asks: MPS or
    time-slicing where every GPU supports it, else exclusive (a whole GPU satisfies any
    request)."""
    mode = SharingMode.EXCLUSIVE
    if cand.mode == SharingMode.MIG and len(cand.gpus) == 1:
        # The policy starts a MIG GPU: the instance asked, if the GPU offers it.
        gpu = cand.gpus[0]
        prof = gpu.spec.mig_profile(wanted)
        if prof is not None and prof.compute_slices <= gpu.free_mig_slices():
            cand.mig_profile = prof
            return
    if wanted in (SharingMode.MPS.value, SharingMode.TIME_SLICING.value):
        asked = SharingMode(wanted)
        if all(g.spec.supports(asked) for g in cand.gpus) and len(cand.gpus) == 1:
            mode = asked
    cand.start_fresh(mode)


def _smallest_mig_profile(spec: GpuSpec, need_mb: float, free_slices: int) -> MigProfile | None:
    """The MIG profile with the least memory >= ``need_mb`` that fits in ``free_slices``."""
    best = None
    for prof in spec.mig_profiles:
        if (
            prof.memory_mb >= need_mb
            and prof.compute_slices <= free_slices
            and (
                best is None
                or (prof.memory_mb, prof.compute_slices) < (best.memory_mb, best.compute_slices)
            )
        ):
            best = prof
    return best
