"""Gangs: jobs larger than any node, placed all or nothing over several nodes.

A job asking for more GPUs than any up node holds of one usable model (with the cores) gets
whole idle GPUs of ONE model on several nodes, exclusively, with ``job.cpus`` cores on each
node: all of them in one decision or none (a gang is never half placed, so two gangs cannot
each hold half of what they need). A job that one node could hold, busy or not, waits for that
node and is never spread (``FrameworkPolicy.one_node_holds``). Among gangs: the fewest nodes,
then the fullest nodes (fewest idle GPUs left on them), then cluster order; node rank 0 is the
node giving the most GPUs (``WorkingView.gang`` chooses the nodes). A spread job runs slower
(gradients cross the network): the explanation quotes its profile's unconsolidated time, else
``unconsolidated_speed``. A waiting gang's reason says what is missing and, from the running
jobs' progress and profiled times, when enough GPUs are predicted to be idle ("needs 8 V100 at
once on several nodes ...: 5 idle; 3 more expected in about 25 min when job 812 is predicted to
end").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.domain import JobSpec
from scheduler.policies.candidate import Candidate
from scheduler.policies.explanations import duration_text, gb
from scheduler.policies.working_view import WorkingView


def gang_candidates(job: JobSpec, view: WorkingView, sids: Sequence[int]) -> list[Candidate]:
    """One gang per usable spec (spec ids ``sids``) with ``job.gpus`` idle GPUs over its nodes
    (``WorkingView.gang``), the most consolidated first."""
    k = job.gpus
    out: list[Candidate] = []
    for sid in sids:
        if len(view.idle_pools.get(sid, ())) < k:
            continue  # fewer idle GPUs of this spec in the whole cluster
        cand = view.gang(sid, k, job.cpus)
        if cand is not None:
            out.append(cand)
    out.sort(key=lambda c: c.rank)
    return out


def spread_speed_text(job: JobSpec, model: str, speed: float) -> str:
    """ "unconsolidated speed 0.50x (measured)": the job's speed spread over nodes relative
    to one node, from its profile, else ``speed`` (the policy's ``unconsolidated_speed``, an
    assumption)."""
    profile = job.profile
    if profile is None or model not in profile.gpu_time_s:
        return f"unconsolidated speed {speed:.2f}x assumed (no profiled time on {model})"
    spread, measured = profile.spread_time_s(model, speed)
    base = profile.gpu_time_s[model]
    if not spread or not math.isfinite(spread):
        return "unconsolidated speed unknown"
    how = "measured" if measured else "assumed: the profile has no unconsolidated time"
    return f"unconsolidated speed {base / spread:.2f}x ({how})"


def gang_text(
    job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView, speed: float
) -> str:
    """Why a gang (several nodes): which nodes, why not one, how consolidated, how fast
    (``speed``: the policy's ``unconsolidated_speed``)."""
    gpu = chosen.gpus[0]
    model = gpu.spec.model
    k = len(chosen.gpus)
    parts = chosen.parts
    names = [node.name for node, _ in parts]
    where = ", ".join(names[:-1]) + f" and {names[-1]}"
    largest = view.largest_node(gpu.sid, job.cpus)
    idle = len(view.idle_pools.get(gpu.sid, ()))  # before this reservation
    text = (
        f"{k} GPUs on {where}: no single node has {k} {model} (the largest holds "
        f"{largest}); {len(parts)} nodes, the fewest with them idle now, fullest first "
        f"({idle} idle {model}); placed on {chosen.label} exclusive; "
        f"{spread_speed_text(job, model, speed)}"
    )
    if len(cands) > 1:
        text += f"; {len(cands)} GPU models could take it"
    return text


def gang_wait_reason(
    job: JobSpec,
    view: WorkingView,
    sids: Sequence[int],
    allowed: frozenset[str] | None,
    speed: float,
) -> str:
    """Why a gang waits: what is missing, and when enough GPUs are predicted to be idle
    (``WorkingView.release_times``), on the usable spec (spec ids ``sids``; ``allowed``: the
    models it may run on, None: any) predicted to have them first."""
    k, cpus = job.gpus, job.cpus
    need = job.memory_need_mb()
    best: tuple[tuple[float, int], str] | None = None
    largest_total = 0
    for sid in sids:
        spec = view.specs[sid]
        model = spec.model
        caps = view.node_caps.get(sid, {})
        total = sum(size * n for (size, cores), n in caps.items() if cores <= 0 or cores >= cpus)
        largest_total = max(largest_total, total)
        if total < k:
            continue
        largest = view.largest_node(sid, cpus)
        head = (
            f"needs {k} {model} at once on several nodes (no node holds {k}; the largest "
            f"holds {largest})"
        )
        idle = len(view.idle_pools.get(sid, ()))
        if idle >= k:
            usable = sum(
                c
                for c, orders in view.idle_buckets.get(sid, {}).items()
                for o in orders
                if view.nodes[o].has_cores(cpus)
            )
            if usable < k:
                text = (
                    f"{head}: {idle} idle but only {usable} on nodes with {cpus} free "
                    f"core{'s' if cpus != 1 else ''}"
                )
                key = (0.0, -usable)
                if best is None or key < best[0]:
                    best = (key, text)
                continue
            idle = usable
        missing = k - idle
        known, unknown = view.release_order(sid, speed)
        if len(known) >= missing:
            wait_s, job_id = known[missing - 1]
            text = (
                f"{head}: {idle} idle; {missing} more expected in "
                f"{duration_text(wait_s)} when job {job_id} is predicted to end"
            )
            key = (wait_s, -idle)
        else:
            text = (
                f"{head}: {idle} idle; {missing} more needed but only {len(known)} of the "
                f"{len(known) + unknown} busy GPUs have a predicted end (the others run "
                f"jobs that are paused or have neither a profiled time nor a time limit)"
            )
            key = (math.inf, -idle)
        if best is None or key < best[0]:
            best = (key, text)
    if best is not None:
        return best[1]
    only = f" (profiled models: {', '.join(sorted(allowed))})" if allowed is not None else ""
    cores = f" on nodes with {cpus} cores" if cpus > 1 else ""
    return (
        f"needs {k} GPUs of one model with {gb(need)} GB{only}{cores}: the nodes that are "
        f"up hold at most {largest_total} of one such model"
    )
