"""``quota``: project quotas with borrowing and reclaim, and fair-share ordering, around any
registered policy (docs/projects.md).

Each project has, per GPU model, a **guaranteed** number of GPUs and a **borrowing limit**
(``ClusterState.accounts.quotas``; a project without a quota row for a model has 0 guaranteed
and no borrowing limit, so a cluster without quotas behaves as the wrapped policy does). A cycle:

1. **Order.** The queue is walked in (priority, fair-share factor, queue position) order, higher
   first; a job whose project still has room in its guarantee (counting the GPUs its running
   jobs hold and the jobs before it in this walk) is in the first tier, the others (they would
   borrow) in the second. The wrapped policy sees the first tier, then the second: guaranteed
   work is placed before borrowed work.
2. **Admit.** Each placement the wrapped policy decides is checked against the project's quota
   on the GPU model it chose: within the guarantee it is admitted; beyond it, it borrows idle
   capacity up to the borrowing limit; past the limit it is refused and waits with a reason
   ("project X at its guaranteed 4 V100; borrowing limit reached (2 borrowed of 2)"). When a
   decision is refused the wrapped policy runs again without the refused jobs (at most
   ``max_rounds`` rounds), so the GPUs they would have taken go to others in the same cycle.
3. **Reclaim.** A first-tier job still queued whose project is below its guarantee on a model
   it can run on (enough memory; a profiled model if its profile names some) with too few idle
   GPUs gets them back: running jobs of projects above their own guarantee on
   that model (borrowed GPUs) are requeued, newest first, until enough are freed (REQUEUE
   actions; the live loop stops them and they queue again, now in the second tier). The job
   waits with "reclaiming N V100 borrowed by project Y (jobs 7, 9)" meanwhile.

GPU counts are a job's GPUs (a shared GPU counts once for each job on it). CPU-only jobs and
jobs without a project are not limited. The wrapped policy chooses the GPU model; a job refused
on the model it chose waits this cycle even if another model had room (a known limit).

Parameters:

- ``base`` (str, "fifo"): the registered policy that places jobs.
- ``base_params`` (mapping or None): its parameters; any parameter that is not one of the
  wrapper's own is passed to it as well.
- ``reclaim`` (bool, True): requeue borrowed jobs when a project needs its guarantee back.
- ``fair_share`` (bool, True): order each tier by the fair-share factor after priority
  (``scheduler.fairshare``); off: by priority, then queue order.
- ``max_rounds`` (int, 3): how often the wrapped policy may run in one cycle.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    JobSpec,
    Plan,
    ProjectQuota,
    RunningJob,
)
from scheduler.fairshare import fair_share_factors, job_factor
from scheduler.policies.base import Policy, PolicyError

quota_defaults: dict[str, Any] = {
    "base": "fifo",
    "base_params": None,
    "reclaim": True,
    "fair_share": True,
    "max_rounds": 3,
}

Key = tuple[str, str]  # (project, GPU model)


class QuotaBook:
    """Quotas and GPUs held, per (project, GPU model), as one cycle changes them."""

    def __init__(self, quotas: Sequence[ProjectQuota]) -> None:
        self.quotas: dict[Key, ProjectQuota] = {(q.project, q.gpu_model): q for q in quotas}
        self.used: Counter[Key] = Counter()

    def guaranteed(self, key: Key) -> int:
        q = self.quotas.get(key)
        return q.guaranteed if q else 0

    def cap(self, key: Key) -> int | None:
        """Most GPUs the project may hold on the model (None: no limit)."""
        q = self.quotas.get(key)
        if q is None or q.borrow_limit is None:
            return None
        return q.guaranteed + q.borrow_limit

    def refusal(self, key: Key, gpus: int) -> str | None:
        """Why the project may not take ``gpus`` more GPUs of the model (None: it may)."""
        cap = self.cap(key)
        used = self.used[key]
        if cap is None or used + gpus <= cap:
            return None
        project, model = key
        guaranteed = self.guaranteed(key)
        limit = cap - guaranteed
        if used >= guaranteed:
            borrowed = used - guaranteed
            if limit == 0:
                return f"project {project} at its guaranteed {guaranteed} {model}; no borrowing"
            return (
                f"project {project} at its guaranteed {guaranteed} {model}; borrowing limit "
                f"reached ({borrowed} borrowed of {limit})"
            )
        return (
            f"project {project} holds {used} of its guaranteed {guaranteed} {model}; "
            f"{gpus} more would pass its borrowing limit of {limit}"
        )


def _model_of(state: ClusterState) -> dict[tuple[str, int], str]:
    return {(n.name, g.index): g.spec.model for n in state.nodes for g in n.gpus}


def _models_of(keys: Sequence[tuple[str, int]], model_of: Mapping[tuple[str, int], str]) -> Counter:
    return Counter(model_of.get(k, "?") for k in keys)


class QuotaPolicy(Policy):
    name: ClassVar[str] = "quota"
    defaults: ClassVar[dict[str, Any]] = quota_defaults

    def __init__(self, **params: Any) -> None:
        from scheduler.policies.registry import build_policy

        # Parameters that are not the wrapper's own go to the base policy (which checks them),
        # so ``build_policy("quota", {"backfill": True})`` configures the base fifo.
        own = {k: v for k, v in params.items() if k in self.defaults}
        passed = {k: v for k, v in params.items() if k not in self.defaults}
        super().__init__(**own)

        base = self.params["base"]
        if not isinstance(base, str) or base == self.name:
            raise PolicyError(f"policy {self.name!r}: base must name another policy, got {base!r}")
        rounds = self.params["max_rounds"]
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= 20:
            raise PolicyError(f"policy {self.name!r}: max_rounds must be 1 to 20, got {rounds!r}")
        self.base = build_policy(base, {**dict(self.params.get("base_params") or {}), **passed})

    # -- ordering -------------------------------------------------------------------------------

    def _order(self, state: ClusterState, book: QuotaBook) -> tuple[list[JobSpec], set[str]]:
        """The queue in tier order, and the ids of the first tier (see the module docstring)."""
        factors = (
            fair_share_factors(state.accounts, state.pending) if self.params["fair_share"] else {}
        )
        position = {job.id: i for i, job in enumerate(state.pending)}
        ordered = sorted(
            state.pending,
            key=lambda j: (-j.priority, -job_factor(j, factors), position[j.id]),
        )
        headroom: dict[str, int] = defaultdict(int)
        for (project, _model), q in book.quotas.items():
            headroom[project] += q.guaranteed
        for (project, _model), used in book.used.items():
            headroom[project] -= used
        first: list[JobSpec] = []
        second: list[JobSpec] = []
        for job in ordered:
            if job.gpus > 0 and job.project is not None and headroom[job.project] >= job.gpus:
                headroom[job.project] -= job.gpus
                first.append(job)
            else:
                second.append(job)
        return first + second, {j.id for j in first}

    # -- the cycle -------------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        model_of = _model_of(state)
        book = QuotaBook(state.accounts.quotas)
        for r in state.running:
            if r.job.project is not None:
                for model, n in _models_of(r.placement.gpu_keys, model_of).items():
                    book.used[(r.job.project, model)] += n
        held = Counter(book.used)
        ordered, first_tier = self._order(state, book)
        jobs = {j.id: j for j in ordered}

        refused: dict[str, str] = {}
        plan = Plan()
        base_actions: tuple[Action, ...] = ()
        admitted: list[Decision] = []
        for round_no in range(int(self.params["max_rounds"])):
            queue = tuple(j for j in ordered if j.id not in refused)
            plan = self.base.schedule(replace(state, pending=queue), rng)
            if round_no == 0:
                # Actions on running jobs come from the first run (later runs see the same
                # running jobs: passing theirs on too would repeat them).
                base_actions = plan.actions
            book.used = Counter(held)
            admitted = []
            newly = False
            for decision in plan.decisions:
                job = jobs.get(decision.placement.job_id)
                if job is None:
                    continue
                if job.project is None or job.gpus <= 0:
                    admitted.append(self._note_borrowing(decision, job, Counter(), book))
                    continue
                counts = _models_of(decision.placement.gpu_keys, model_of)
                reason = next(
                    (
                        why
                        for model, n in counts.items()
                        if (why := book.refusal((job.project, model), n)) is not None
                    ),
                    None,
                )
                if reason is not None:
                    refused[job.id] = reason
                    newly = True
                    continue
                for model, n in counts.items():
                    book.used[(job.project, model)] += n
                admitted.append(self._note_borrowing(decision, job, counts, book))
            if not newly:
                break
            if round_no == int(self.params["max_rounds"]) - 1:
                break

        placed = {d.placement.job_id for d in admitted}
        waiting: dict[str, str] = {}
        for job in ordered:
            if job.id in placed:
                continue
            if job.id in refused:
                waiting[job.id] = f"waiting for quota: {refused[job.id]}"
                continue
            reason = plan.waiting.get(job.id, "not placed by the base policy this cycle")
            if job.id not in first_tier and job.gpus > 0 and job.project is not None:
                reason += f" (project {job.project} is past its guarantee: it would borrow)"
            waiting[job.id] = reason

        actions = list(base_actions)
        if self.params["reclaim"]:
            actions += self._reclaim(state, ordered, first_tier, placed, admitted, book, waiting)
        return Plan(decisions=tuple(admitted), actions=tuple(actions), waiting=waiting)

    def _note_borrowing(
        self, decision: Decision, job: JobSpec, counts: Counter, book: QuotaBook
    ) -> Decision:
        notes = []
        for model in counts:
            key = (job.project or "", model)
            over = book.used[key] - book.guaranteed(key)
            if over > 0:
                notes.append(
                    f"borrows {min(over, counts[model])} {model} beyond project {job.project}'s "
                    f"guaranteed {book.guaranteed(key)} (reclaimable)"
                )
        text = f"{decision.policy}: {decision.explanation}"
        if notes:
            text += f"; {'; '.join(notes)}"
        return replace(decision, policy=self.name, explanation=text)

    def _reclaim(
        self,
        state: ClusterState,
        ordered: list[JobSpec],
        first_tier: set[str],
        placed: set[str],
        admitted: list[Decision],
        book: QuotaBook,
        waiting: dict[str, str],
    ) -> list[Action]:
        """REQUEUE borrowed jobs for first-tier jobs still queued (see the module docstring).

        A multi-GPU job that fits on one node (some node has that many GPUs of the model) gets
        them on one node: the node needing the fewest requeues (then the one whose borrowed jobs
        started last); otherwise, and for one-GPU jobs, GPUs anywhere, newest borrowed first."""
        model_of = _model_of(state)
        taken = {k for d in admitted for k in d.placement.gpu_keys}
        idle: Counter[str] = Counter()
        idle_on: Counter[tuple[str, str]] = Counter()  # (node, model)
        size_on: Counter[tuple[str, str]] = Counter()
        memory_of: dict[str, float] = {}  # largest GPU memory of each model (MB)
        for node in state.nodes:
            if not node.up:
                continue
            for g in node.gpus:
                size_on[(node.name, g.spec.model)] += 1
                memory_of[g.spec.model] = max(memory_of.get(g.spec.model, 0.0), g.spec.memory_mb)
                if g.idle and g.key not in taken:
                    idle[g.spec.model] += 1
                    idle_on[(node.name, g.spec.model)] += 1
        # Running jobs that hold GPUs of each model, newest first.
        on_model: dict[str, list[RunningJob]] = defaultdict(list)
        for r in sorted(state.running, key=lambda r: (-r.started_s, _id_key(r.job.id))):
            if r.job.project is None or r.paused:
                continue
            for model in _models_of(r.placement.gpu_keys, model_of):
                on_model[model].append(r)
        requeued: set[str] = set()
        actions: list[Action] = []
        for job in ordered:
            if job.id in placed or job.id not in first_tier or job.project is None:
                continue
            project = job.project
            # The model where the project is owed the most (and is owed enough for this job).
            # Only models the job can run on: requeuing others' jobs for a job that would not
            # fit anyway would requeue them again every other cycle.
            profiled = {m for m, t in (job.profile.gpu_time_s if job.profile else {}).items() if t}
            owed = sorted(
                (
                    (book.guaranteed(key) - book.used[key], key[1])
                    for key in book.quotas
                    if key[0] == project
                    and book.guaranteed(key) - book.used[key] >= job.gpus
                    and job.memory_need_mb() <= memory_of.get(key[1], 0.0)
                    and (not profiled or key[1] in profiled)
                ),
                key=lambda t: (-t[0], t[1]),
            )
            if not owed:
                continue
            model = owed[0][1]
            nodes = [
                n
                for (n, m), size in size_on.items()
                if m == model and size >= job.gpus and job.gpus > 1
            ]
            victims: list[RunningJob] = []
            freed = 0
            where = ""
            if nodes:  # it waits for one node: free the GPUs there
                roomy = next((n for n in nodes if idle_on[(n, model)] >= job.gpus), None)
                if roomy is not None:  # room is there: the base policy had another reason
                    idle_on[(roomy, model)] -= job.gpus
                    idle[model] -= job.gpus
                    book.used[(project, model)] += job.gpus
                    continue
                # Fewest requeues; among equals, the node whose victims started last.
                best: tuple[tuple[int, float], str, list[RunningJob], int] | None = None
                for n in nodes:
                    need = job.gpus - idle_on[(n, model)]
                    picked, got = self._victims(
                        on_model[model], model, need, book, requeued, project, model_of, n
                    )
                    if got < need or not picked:
                        continue
                    rank = (len(picked), -max(r.started_s for r in picked))
                    if best is None or rank < best[0]:
                        best = (rank, n, picked, got)
                if best is not None:
                    _, where, victims, freed = best
                    idle_on[(where, model)] = idle_on[(where, model)] + freed - job.gpus
                    where = f" on {where}"
            if not victims and not nodes:
                if idle[model] >= job.gpus:
                    idle[model] -= job.gpus
                    book.used[(project, model)] += job.gpus
                    continue
                victims, freed = self._victims(
                    on_model[model],
                    model,
                    job.gpus - idle[model],
                    book,
                    requeued,
                    project,
                    model_of,
                )
            if not victims:
                continue
            for r in victims:
                requeued.add(r.job.id)
                lender = (r.job.project or "", model)
                book.used[lender] -= _models_of(r.placement.gpu_keys, model_of)[model]
            idle[model] = max(0, idle[model] + freed - job.gpus)
            book.used[(project, model)] += job.gpus
            lenders = sorted({r.job.project or "" for r in victims})
            ids = ", ".join(r.job.id for r in victims)
            waiting[job.id] = (
                f"waiting for its guaranteed {model}: reclaiming {freed} {model}{where} borrowed "
                f"by project {', '.join(lenders)} (jobs {ids})"
            )
            for r in victims:
                actions.append(
                    Action(
                        ActionKind.REQUEUE,
                        r.job.id,
                        self.name,
                        f"requeued: its {model} were borrowed beyond project {r.job.project}'s "
                        f"guarantee and project {project} reclaims them for job {job.id}",
                    )
                )
        return actions

    @staticmethod
    def _victims(
        candidates: list[RunningJob],
        model: str,
        need: int,
        book: QuotaBook,
        requeued: set[str],
        project: str,
        model_of: Mapping[tuple[str, int], str],
        node: str | None = None,
    ) -> tuple[list[RunningJob], int]:
        """Borrowed jobs (newest first) whose requeue frees ``need`` GPUs of ``model`` (on
        ``node`` only, if given), and how many they free; fewer when there are not enough. A
        lender keeps its guarantee: only its jobs beyond it are taken."""
        taken: Counter[Key] = Counter()
        chosen: list[RunningJob] = []
        freed = 0
        for r in candidates:
            if freed >= need:
                break
            lender = r.job.project or ""
            key = (lender, model)
            if r.job.id in requeued or lender == project:
                continue
            if book.used[key] - taken[key] <= book.guaranteed(key):
                continue  # within its own guarantee: not borrowed
            on_model = [k for k in r.placement.gpu_keys if model_of.get(k) == model]
            here = len(on_model) if node is None else sum(1 for k in on_model if k[0] == node)
            if here == 0:
                continue
            chosen.append(r)
            taken[key] += len(on_model)
            freed += here
        return chosen, freed


def _id_key(job_id: str) -> tuple[int, int | str]:
    """Newest first among jobs started at the same time: larger numeric ids first."""
    return (0, -int(job_id)) if job_id.isdigit() else (1, job_id)
