"""``sharing_mode``: time-slicing, MPS or MIG per job on a heterogeneous cluster (ALGORITHMS §4,
paper 001), with its baselines ``byscale`` and ``sharing_random``.

Every single-GPU job is described by three classes from its profile (``scheduler.classes``):
**scale** (batch size x image size: small / medium / big), **sensitivity** (throughput gain
from the smallest MIG instance to the whole GPU: high >= 2) and **C/M** (SM / memory
utilisation: C >= 10, else M). Candidates are every feasible (GPU, mode) pair the GPU's
configuration allows (``GpuSpec.sharing_modes``): an idle GPU may start under any of its
sharing modes, a shared GPU keeps its mode.

The criteria of section 4.3.2, per candidate GPU (``preferred_mode``):

1. big and low sensitivity -> time-slicing;
2. medium or small and high sensitivity -> MPS or MIG (decided by 3-5);
3. on an idle GPU: high sensitivity -> MIG, low -> MPS;
4. a memory-intensive (M) job already runs there and the new job is M -> MIG;
5. otherwise (the pair is C+C or C+M): high sensitivity -> MIG, low -> MPS.

Criteria 3-5 decide every job that criterion 1 does not (criterion 2 is their consequence);
a big, highly sensitive job therefore goes to MIG. Criteria 3-5 compare MPS with MIG by what
runs on the MPS GPU: a candidate is *preferred* (tier 0) when its mode is the one they give
(an MPS GPU is judged by its own residents, a MIG instance is isolated from its neighbours);
the other of MPS and MIG comes second (tier 1: criterion 2 allows either, so a low-sensitivity
job takes MIG when no MPS GPU is free); time-slicing for a job criterion 1 does not send
there, and an MPS GPU that criterion 4 rules out (a memory-intensive job next to another), are
fallbacks (tier 2). Within the best tier the policy takes the candidate where the job is
expected to finish first: its profiled solo time on that GPU model (the
per-model sensitivity of the profile) divided by its expected share there (time-slicing:
``1 / (n + 1)``; MPS: the ``class_based`` interference estimate; MIG: the instance's share of
the SMs to the power ``ln(sensitivity) / ln 4``), plus ``mig_relayout_s`` when a MIG instance
must be created. Only memory that fits is considered (criterion "only when the resource's free
memory covers the job's demand"): the GPU's free memory under time-slicing and MPS, the
instance's under MIG.

**Reading chosen** where the paper is silent: with ``fallback`` on (default) a job whose
MPS and MIG GPUs (or time-slicing ones, for criterion 1) are all full takes the best other
candidate rather than wait (the paper's
Kubernetes pods would wait for their resource type; ``fallback: false`` reproduces that);
explanations say when a job fell back. Missing classes: unknown scale counts as medium,
unknown sensitivity as low, unknown C/M as C.

MIG instances: a job takes the smallest profile whose memory covers its need; a free instance
of that profile already configured on the GPU (``GpuState.mig_layout``) is used as is, else the
instance is created (on an idle GPU the placement asks for a re-layout, ``Placement.mig_layout``:
the new instance plus the old instances that still fit). MPS: only jobs of one owner share an
MPS GPU (one MPS server per unix user; the framework enforces it for every policy).

Parameters (besides the framework's): ``fallback`` (bool, True), ``mig_relayout_s`` (float,
10.0; the expected cost of creating an instance, to prefer GPUs that have it),
``sensitivity_high`` (float, 2.0), ``cm_threshold`` (float, 10.0).

``byscale`` (the paper's baseline): big -> time-slicing, medium -> MPS, small -> MIG, nothing
else (``fallback`` False by default); the GPU within the mode by the same expected time.
``sharing_random`` (the paper's "Random"): a uniformly random GPU among those that can take
the job (weighted by pool size, as ``random``), then a random mode among those it allows. With
``bind`` (bool, False) each job is instead bound to one GPU drawn from ``bind_seed`` (int, 0)
and its id, among the GPUs whose memory could ever hold it, and waits for that GPU (a pod sent
to a random node).
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from scheduler.catalog import valid_mig_layout
from scheduler.classes import (
    CM_THRESHOLD,
    SENSITIVITY_HIGH_MIN,
    cm_class,
    profile_scale_class,
    sensitivity_class,
)
from scheduler.domain import (
    SHARING_ALLOWED,
    ClusterState,
    GpuSpec,
    JobSpec,
    MigProfile,
    Plan,
    SharingMode,
)
from scheduler.interference import ClassBasedInterference
from scheduler.policies.base import PolicyError
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkGpu,
    WorkingView,
    framework_defaults,
    gb,
    job_type_key,
    oom_beside,
)

MIG, MPS, TS, EXCL = (
    SharingMode.MIG,
    SharingMode.MPS,
    SharingMode.TIME_SLICING,
    SharingMode.EXCLUSIVE,
)
_MODE_TEXT = {MIG: "MIG", MPS: "MPS", TS: "time-slicing", EXCL: "exclusive"}
SENSITIVITY_SPAN = 4.0  # sensitivity is measured from a quarter of the SMs (A30 1g) up
MIG_SCAN = 16  # GPUs of a MIG pool looked at for a free instance
FALLBACK_TIER = 2  # candidates ranked this or worse are taken only with ``fallback``

sharing_defaults: dict[str, Any] = {
    **framework_defaults,
    "fallback": True,
    "mig_relayout_s": 10.0,
    "sensitivity_high": SENSITIVITY_HIGH_MIN,
    "cm_threshold": CM_THRESHOLD,
}


class SharingCandidate(Candidate):
    """A candidate with what the placement needs beyond the framework's fields."""

    __slots__ = ("mig_layout", "creates", "est_s", "tier", "why")

    def __init__(
        self,
        node: Any,
        gpus: tuple[WorkGpu, ...],
        mode: SharingMode,
        mig_profile: MigProfile | None = None,
        pool: list[WorkGpu] | None = None,
        *,
        mig_layout: tuple[str, ...] | None = None,
        creates: bool = False,
    ) -> None:
        super().__init__(node, gpus, mode, mig_profile, pool)
        self.mig_layout = mig_layout  # a re-layout to request (idle GPU only)
        self.creates = creates  # a MIG instance must be created first
        self.est_s = math.inf
        self.tier = 0
        self.why = ""

    def start_fresh(self, mode: SharingMode) -> None:
        super().start_fresh(mode)
        self.mig_layout = None
        self.creates = False


class _MigState:
    """A MIG GPU's instances during one cycle: configured layout and instances in use."""

    __slots__ = ("layout", "used")

    def __init__(self, layout: Sequence[str]) -> None:
        self.layout = list(layout)
        self.used: Counter[str] = Counter()

    def free(self, profile: str) -> bool:
        return self.layout.count(profile) > self.used[profile]

    def in_use(self) -> list[str]:
        return list(self.used.elements())


def describe(job: JobSpec, *, high: float, cm_threshold: float) -> tuple[str, str, str]:
    """(scale, sensitivity, C/M class) of ``job`` with the documented defaults for unknowns."""
    profile = job.profile
    scale = profile_scale_class(profile) or "medium"
    sens = sensitivity_class(profile, high_min=high) or "low"
    cls = cm_class(profile, threshold=cm_threshold) or "C"
    return scale, sens, cls


def preferred_mode(
    scale: str, sens: str, cls: str, residents: Sequence[tuple[str, str]]
) -> tuple[SharingMode, str]:
    """The mode the criteria of §4.3.2 give a job with these classes next to an MPS GPU whose
    residents have these (scale, C/M) classes; and which criterion decided, as text."""
    if scale == "big" and sens == "low":
        return TS, "criterion 1 (big, low sensitivity -> time-slicing)"
    if not residents:
        mode = MIG if sens == "high" else MPS
        return mode, f"criterion 3 (idle GPU, {sens} sensitivity -> {_MODE_TEXT[mode]})"
    if cls == "M" and any(c == "M" for _, c in residents):
        return MIG, "criterion 4 (memory-intensive next to a memory-intensive job -> MIG)"
    pair = "C+M" if cls == "M" or any(c == "M" for _, c in residents) else "C+C"
    mode = MIG if sens == "high" else MPS
    return mode, f"criterion 5 ({pair}, {sens} sensitivity -> {_MODE_TEXT[mode]})"


def criteria_tier(
    scale: str, sens: str, cls: str, mode: SharingMode, residents: Sequence[tuple[str, str]]
) -> tuple[int, str]:
    """How the criteria rank a candidate under ``mode`` on a GPU with these residents:
    0 = the mode they give; 1 = the other of MPS / MIG, which criterion 2 also allows (taken
    when no GPU of the preferred mode is free); 2 = outside the criteria (a fallback)."""
    want, why = preferred_mode(scale, sens, cls, residents if mode == MPS else [])
    if mode == MPS and want == MIG and residents and why.startswith("criterion 4"):
        return 2, f"{why}: not this MPS GPU"
    if mode == want:
        return 0, why
    if want in (MPS, MIG) and mode in (MPS, MIG):
        return 1, f"{why}, none free: {_MODE_TEXT[mode]} (criterion 2 allows MPS or MIG)"
    return 2, f"{why}, none free: fell back to {_MODE_TEXT[mode]}"


class SharingPolicyBase(FrameworkPolicy):
    """Candidates per (GPU, mode) with MIG layouts; subclasses rank them (``rank``)."""

    colocate: ClassVar[bool] = True
    defaults: ClassVar[Mapping[str, Any]] = sharing_defaults

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        try:
            self.relayout_s = float(p["mig_relayout_s"])
            self.high = float(p["sensitivity_high"])
            self.cm_threshold = float(p["cm_threshold"])
        except (TypeError, ValueError) as exc:
            raise PolicyError(
                f"policy {self.name!r}: mig_relayout_s, sensitivity_high and cm_threshold "
                "must be numbers"
            ) from exc
        self.estimator = ClassBasedInterference(cm_threshold=self.cm_threshold)
        self._mig: dict[tuple[str, int], _MigState] = {}
        self._layouts_here = False
        self._extras: dict[str, dict[str, Any]] = {}
        self._waiting_note: dict[str, str] = {}

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        self._extras, self._waiting_note = {}, {}
        plan = super().schedule(state, rng)
        if not self._extras and not self._waiting_note:
            return plan
        decisions = tuple(
            replace(d, placement=replace(d.placement, **self._extras[d.placement.job_id]))
            if d.placement.job_id in self._extras
            else d
            for d in plan.decisions
        )
        waiting = {j: self._waiting_note.get(j, why) for j, why in plan.waiting.items()}
        return Plan(decisions=decisions, actions=plan.actions, waiting=waiting)

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        super().begin_cycle(state, view)
        mig: dict[tuple[str, int], _MigState] = {}
        layouts = False
        for node in state.nodes:
            for g in node.gpus:
                if g.spec.mig_profiles and (g.mig_layout or g.mode == MIG):
                    mig[g.key] = _MigState(g.mig_layout)
                    layouts = True
        for r in state.running:
            pl = r.placement
            if pl.mode == MIG and pl.mig_profile:
                for idx in pl.gpu_indices:
                    st = mig.setdefault((pl.node, idx), _MigState(()))
                    st.used[pl.mig_profile] += 1
                    if st.layout.count(pl.mig_profile) < st.used[pl.mig_profile]:
                        st.layout.append(pl.mig_profile)  # the snapshot knew no layout
        self._mig = mig
        self._layouts_here = layouts
        self._rank_memo: dict[tuple[Any, ...], tuple[int, float, str]] = {}
        self._profile_memo: dict[tuple[str, float], MigProfile | None] = {}
        self._describe_memo: dict[str, tuple[str, str, str]] = {}
        self._counts: dict[str, tuple[int, int]] = {}
        self._mig_memo: dict[tuple[Any, ...], tuple[WorkGpu, bool] | None] = {}
        self._rule_4: set[str] = set()
        self._gpu_memory: dict[str, int] = {}  # model -> memory (MB) of the GPUs that are up
        for n in state.nodes:
            for g in n.gpus if n.up else ():
                self._gpu_memory[g.spec.model] = g.spec.memory_mb

    def feasibility_key(self, job: JobSpec) -> Any:
        return (job.owner, self.describe(job))

    def describe(self, job: JobSpec) -> tuple[str, str, str]:
        memo = getattr(self, "_describe_memo", None)
        if memo is None:
            return describe(job, high=self.high, cm_threshold=self.cm_threshold)
        out = memo.get(job.id)
        if out is None:
            out = memo[job.id] = describe(job, high=self.high, cm_threshold=self.cm_threshold)
        return out

    # -- candidates ----------------------------------------------------------------------------

    def modes_of(self, spec: GpuSpec) -> list[SharingMode]:
        """The modes an idle GPU of ``spec`` may start under: its sharing modes, else
        exclusive."""
        modes = [m for m in (TS, MPS, MIG) if spec.supports(m)]
        if MIG in modes and not spec.mig_profiles:
            modes.remove(MIG)
        return modes or [EXCL]

    #: Return only the best candidate of each tier (cheap on large clusters); a policy that
    #: draws among all candidates (``sharing_random``) sets it False.
    shortlist: ClassVar[bool] = True

    def candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        if job.gpus != 1 or job.sharing != SHARING_ALLOWED or not job.may_share():
            # Whole GPUs, or the mode the job asked: the framework's candidates, which
            # ``honour_request`` restricts to what the job allows.
            return super().candidates(job, view)
        need, cpus, allowed = job.memory_need_mb(), job.cpus, self.allowed_models(job)
        out: list[tuple[Any, ...]] = []  # every offer (when not shortlisting)
        best: dict[int, tuple[float, int, Any]] = {}  # tier -> (est, order, offer args)
        counts = [0, 0]  # candidates, preferred ones
        jtype = job_type_key(job)
        probe = SharingCandidate(None, (), EXCL)  # ranked in place, never returned

        def offer(
            gpu: WorkGpu,
            pool: list[WorkGpu],
            mode: SharingMode,
            situation: tuple[Any, ...],
            prof: MigProfile | None = None,
            layout: tuple[str, ...] | None = None,
            creates: bool = False,
        ) -> None:
            key = (jtype, situation, mode, prof.name if prof else None, creates)
            ranked = self._rank_memo.get(key)
            if ranked is None:
                probe.node, probe.gpus, probe.mode = gpu.node, (gpu,), mode
                probe.mig_profile, probe.pool = prof, pool
                probe.mig_layout, probe.creates = layout, creates
                self.rank(job, probe)
                ranked = self._rank_memo[key] = (probe.tier, probe.est_s, probe.why)
            tier = ranked[0]
            counts[0] += 1
            counts[1] += tier == 0
            if mode == MPS and ranked[2].startswith("criterion 4"):
                self._rule_4.add(job.id)  # an MPS GPU was ruled out: MIG is criterion 4's
            args = (gpu, pool, mode, prof, layout, creates, ranked)
            if not self.shortlist:
                out.append(args)
                return
            held = best.get(tier)
            if held is None or (ranked[1], gpu.order) < held[:2]:
                best[tier] = (ranked[1], gpu.order, args)

        for sid, pool in view.idle_pools.items():
            spec = view.specs[sid]
            if not pool or (allowed is not None and spec.model not in allowed):
                continue
            gpu = view.first_with_cores(pool, cpus)
            if gpu is None:
                continue
            for mode in self.modes_of(spec):
                if mode == MIG:
                    found = self._idle_mig(job, spec, pool, gpu)
                    if found is not None:
                        g, prof, layout = found
                        offer(g, pool, MIG, ("idle", sid), prof, layout, layout is not None)
                elif spec.memory_mb >= need:
                    offer(gpu, pool, mode, ("idle", sid))
        limit = int(self.params.get("max_jobs_per_gpu", 2))
        for key, pool in view.shared_pools.items():
            sid, mode, residents, committed, _slices, owners, shunned = key
            spec = view.specs[sid]
            if allowed is not None and spec.model not in allowed:
                continue
            if owners is not None and owners != (job.owner,):
                continue  # one MPS user per GPU
            if oom_beside(job, residents, shunned) is not None:
                continue  # an observed OOM kill of this pair (framework)
            if mode == MIG:
                found_mig = self._shared_mig(job, spec, key, pool, cpus)
                if found_mig is not None:
                    g, prof, creates = found_mig
                    offer(g, pool, MIG, (sid, mode, residents), prof, None, creates)
                continue
            if len(residents) >= limit or spec.memory_mb - committed < need:
                continue
            if not self._co_run_ok(job, key, pool[0], view):
                continue
            gpu = view.first_with_cores(pool, cpus)
            if gpu is not None:
                offer(gpu, pool, mode, (sid, mode, residents))
        self._counts[job.id] = (counts[0], counts[1])
        if not self.shortlist:
            return self.draw(job, out)
        chosen = [self._materialise(*b[2]) for b in best.values()]
        chosen.sort(key=lambda c: (c.order, str(c.mode)))
        return list(chosen)

    def draw(self, job: JobSpec, offers: list[tuple[Any, ...]]) -> list[Candidate]:
        """Policies that do not shortlist choose among every offer here (``sharing_random``)."""
        raise NotImplementedError

    @staticmethod
    def _materialise(
        gpu: WorkGpu,
        pool: list[WorkGpu],
        mode: SharingMode,
        prof: MigProfile | None,
        layout: tuple[str, ...] | None,
        creates: bool,
        ranked: tuple[int, float, str],
    ) -> SharingCandidate:
        cand = SharingCandidate(
            gpu.node, (gpu,), mode, prof, pool, mig_layout=layout, creates=creates
        )
        cand.tier, cand.est_s, cand.why = ranked
        return cand

    def _smallest_profile(self, spec: GpuSpec, need: float) -> MigProfile | None:
        key = (spec.model, need)
        if key not in self._profile_memo:
            fits = [p for p in spec.mig_profiles if p.memory_mb >= need]
            self._profile_memo[key] = (
                min(fits, key=lambda p: (p.memory_mb, p.compute_slices)) if fits else None
            )
        return self._profile_memo[key]

    def _idle_mig(
        self, job: JobSpec, spec: GpuSpec, pool: list[WorkGpu], first: WorkGpu
    ) -> tuple[WorkGpu, MigProfile, tuple[str, ...] | None] | None:
        """(GPU, profile, re-layout or None) for ``job`` on an idle MIG GPU of ``pool``: one
        already laid out with a free instance of its profile if there is one among the first
        ``MIG_SCAN``, else ``first`` re-laid out (the new instance plus the old ones that
        still fit)."""
        prof = self._smallest_profile(spec, job.memory_need_mb())
        if prof is None:
            return None
        if self._layouts_here:
            for gpu in pool[:MIG_SCAN]:
                st = self._mig.get((gpu.node.name, gpu.index))
                if st is not None and st.free(prof.name) and gpu.node.has_cores(job.cpus):
                    return gpu, prof, None
        st = self._mig.get((first.node.name, first.index))
        old = st.layout if st is not None else []
        layout = [prof.name]
        for name in old:
            if valid_mig_layout(spec, [*layout, name]):
                layout.append(name)
        return first, prof, tuple(layout)

    def _shared_mig(
        self, job: JobSpec, spec: GpuSpec, key: tuple[Any, ...], pool: list[WorkGpu], cpus: int
    ) -> tuple[WorkGpu, MigProfile, bool] | None:
        """(GPU, profile, whether the instance must be created) in a shared MIG pool: a GPU
        with a free instance of the job's profile, else one where it can be created, among the
        pool's first ``MIG_SCAN`` GPUs (a pool holds GPUs with the same jobs and slices used;
        their layouts may differ). Cached per pool and profile while the answer's GPU stays in
        the pool (a reservation moves a GPU to another pool)."""
        prof = self._smallest_profile(spec, job.memory_need_mb())
        if prof is None:
            return None
        memo_key = (key, prof.name, cpus)
        if memo_key in self._mig_memo:
            hit = self._mig_memo[memo_key]
            if hit is None:
                return None
            gpu, creates = hit
            if gpu.pool_key == key and gpu.node.has_cores(cpus):
                return gpu, prof, creates
        creatable = None
        found = None
        for gpu in pool[:MIG_SCAN]:
            if not gpu.node.has_cores(cpus) or prof.compute_slices > gpu.free_mig_slices():
                continue
            st = self._mig.get((gpu.node.name, gpu.index)) or _MigState(())
            if st.free(prof.name):
                found = (gpu, False)
                break
            if creatable is None and valid_mig_layout(spec, [*st.in_use(), prof.name]):
                creatable = gpu
        if found is None and creatable is not None:
            found = (creatable, True)
        self._mig_memo[memo_key] = found
        return None if found is None else (found[0], prof, found[1])

    # -- estimates -----------------------------------------------------------------------------

    def alpha(self, job: JobSpec) -> float:
        s = job.profile.sensitivity if job.profile is not None else None
        if s is None or s <= 0:
            return 1.0
        return min(1.0, max(0.0, math.log(s) / math.log(SENSITIVITY_SPAN)))

    def expected_s(self, job: JobSpec, cand: SharingCandidate) -> float:
        """Expected run time of ``job`` there (seconds, or a relative figure without solo
        times): solo time on the model / expected share, + instance creation."""
        gpu = cand.gpus[0]
        solo = job.solo_time_s(gpu.spec.model)
        if solo is None:
            solo = 1000.0  # unprofiled: only the share matters
        residents = gpu.jobs
        if cand.mode == MIG and cand.mig_profile is not None:
            share = cand.mig_profile.compute_slices / max(1, gpu.spec.mig_total_slices)
            t = solo / share ** self.alpha(job)
            return t + (self.relayout_s if cand.creates else 0.0)
        if not residents:
            return solo
        if cand.mode == TS:
            return solo * (len(residents) + 1)
        return solo * self.estimator.slowdown(job, residents, gpu.spec, MPS)

    # -- picking and explaining ----------------------------------------------------------------

    def rank(self, job: JobSpec, cand: SharingCandidate) -> None:
        """Set ``cand.tier`` (0 = preferred, 1 = second choice, >= ``FALLBACK_TIER`` = only
        with ``fallback``), ``cand.est_s`` and ``cand.why``."""
        raise NotImplementedError

    def allow_fallback(self) -> bool:
        return bool(self.params.get("fallback", True))

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        if job.gpus != 1 or not all(isinstance(c, SharingCandidate) for c in cands):
            return super().pick(job, cands, view, rng)  # CPU or whole-GPU candidates
        best: SharingCandidate | None = None
        for c in cands:
            assert isinstance(c, SharingCandidate)
            if c.tier >= FALLBACK_TIER and not self.allow_fallback():
                continue
            c.score = -c.est_s
            if best is None or (c.tier, c.est_s, c.order) < (best.tier, best.est_s, best.order):
                best = c
        if best is not None:
            self.commit(job, best)
        elif cands:
            wanted = next((c.why for c in cands if isinstance(c, SharingCandidate)), "")
            total = self._counts.get(job.id, (len(cands), 0))[0]
            self._waiting_note[job.id] = (
                f"{wanted.split(', none free')[0]}: no GPU free under that mode and fallback "
                f"is off ({total} placements under other modes possible)"
            )
        return best

    def no_fit_reason(self, job: JobSpec, view: WorkingView) -> str:
        if job.gpus >= 1:
            need, allowed = job.memory_need_mb(), self.allowed_models(job)
            biggest = max(
                (m for model, m in self._gpu_memory.items() if allowed is None or model in allowed),
                default=0,
            )
            if biggest and need > biggest:
                return f"needs {gb(need)} GB per GPU: the largest GPU here has {gb(biggest)} GB"
        return super().no_fit_reason(job, view)

    def commit(self, job: JobSpec, cand: SharingCandidate) -> None:
        """Book what the framework does not: the MIG instance and placement extras."""
        extras: dict[str, Any] = {}
        if cand.mode == MIG and cand.mig_profile is not None:
            gpu = cand.gpus[0]
            key = (gpu.node.name, gpu.index)
            st = self._mig.setdefault(key, _MigState(()))
            if cand.mig_layout is not None:
                st.layout = list(cand.mig_layout)
                extras["mig_layout"] = cand.mig_layout
            elif not st.free(cand.mig_profile.name):
                st.layout = [*st.in_use(), cand.mig_profile.name]
            st.used[cand.mig_profile.name] += 1
            self._layouts_here = True
        if extras:
            self._extras[job.id] = extras

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        if not isinstance(chosen, SharingCandidate) or job.gpus != 1:
            return self.whole_gpus_text(job, chosen, cands)
        scale, sens, cls = self.describe(job)
        where = self.placement_text(job, chosen)
        why = chosen.why
        if chosen.mode == MIG and chosen.tier == 1 and job.id in self._rule_4:
            why = "criterion 4 (memory-intensive job on the MPS GPU -> MIG)"
        text = f"{why}: placed {where} {self.residents_text(chosen)}"
        text += f"; {scale}, {sens} sensitivity, {cls}"
        text += f"; expected {chosen.est_s:.0f} s there"
        if chosen.creates and chosen.mig_profile is not None:
            layout = " + ".join(chosen.mig_layout) if chosen.mig_layout else None
            text += (
                f" (incl. creating the {chosen.mig_profile.name} instance"
                + (f", re-layout to {layout}" if layout else "")
                + ")"
            )
        total, preferred = self._counts.get(job.id, (len(cands), 0))
        text += f"; best of {total} candidates ({preferred} preferred)"
        return text + f"; {self.fit_text(job, chosen)}"


class SharingModePolicy(SharingPolicyBase):
    """The criteria of paper 001 (module docstring)."""

    name: ClassVar[str] = "sharing_mode"

    def rank(self, job: JobSpec, cand: SharingCandidate) -> None:
        scale, sens, cls = self.describe(job)
        residents = [
            (profile_scale_class(r.profile) or "medium", self._cls(r)) for r in cand.gpus[0].jobs
        ]
        cand.tier, cand.why = criteria_tier(scale, sens, cls, cand.mode, residents)
        cand.est_s = self.expected_s(job, cand)

    def _cls(self, job: JobSpec) -> str:
        return cm_class(job.profile, threshold=self.cm_threshold) or "C"


class ByScalePolicy(SharingModePolicy):
    """Paper 001's ByScale: big -> time-slicing, medium -> MPS, small -> MIG."""

    name: ClassVar[str] = "byscale"
    defaults: ClassVar[Mapping[str, Any]] = {**sharing_defaults, "fallback": False}

    def rank(self, job: JobSpec, cand: SharingCandidate) -> None:
        scale, _, _ = self.describe(job)
        want = {"big": TS, "medium": MPS, "small": MIG}[scale]
        cand.est_s = self.expected_s(job, cand)
        why = f"ByScale ({scale} -> {_MODE_TEXT[want]})"
        if cand.mode == want:
            cand.tier, cand.why = 0, why
        else:
            cand.tier = 2
            cand.why = f"{why}, none free: fell back to {_MODE_TEXT[cand.mode]}"


class SharingRandomPolicy(SharingPolicyBase):
    """Paper 001's Random: a random GPU that can take the job, then a random allowed mode.

    ``bind`` (bool, False): instead, each job is bound once to a GPU drawn from
    ``bind_seed`` and its id (among the GPUs whose memory could ever hold it) and waits for
    that GPU: a pod sent to a random node, as on the paper's Kubernetes cluster.
    """

    name: ClassVar[str] = "sharing_random"
    shortlist: ClassVar[bool] = False
    defaults: ClassVar[Mapping[str, Any]] = {**sharing_defaults, "bind": False, "bind_seed": 0}

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        super().begin_cycle(state, view)
        self._usable = {(g.node.name, g.index): g for n in view.nodes for g in n.gpus}
        self._all_gpus = [(n.name, g) for n in state.nodes if n.up for g in n.gpus]

    def bound_gpu(self, job: JobSpec) -> tuple[str, int] | None:
        """The GPU ``job`` is bound to (``bind``), or None if no GPU could ever hold it."""
        need, allowed = job.memory_need_mb(), self.allowed_models(job)
        eligible = [
            (node, g.index)
            for node, g in self._all_gpus
            if (allowed is None or g.spec.model in allowed)
            and max([g.spec.memory_mb, *(p.memory_mb for p in g.spec.mig_profiles)]) >= need
        ]
        if not eligible:
            return None
        draw = zlib.crc32(f"{self.params['bind_seed']}:{job.id}".encode())
        return eligible[draw % len(eligible)]

    def bound_offers(self, job: JobSpec, offers: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The offers on the GPU ``job`` is bound to, moved onto that GPU (``bind``)."""
        key = self.bound_gpu(job)
        gpu = self._usable.get(key) if key is not None else None
        out = []
        for g, pool, mode, prof, layout, creates, ranked in offers:
            if gpu is None or key is None or gpu not in pool:
                continue
            if mode == MIG and g is not gpu and prof is not None:
                st = self._mig.get(key) or _MigState(())
                if st.free(prof.name):
                    layout, creates = None, False
                elif gpu.idle:
                    layout, creates = (prof.name,), True
                elif valid_mig_layout(gpu.spec, [*st.in_use(), prof.name]):
                    layout, creates = None, True
                else:
                    continue
            out.append((gpu, [gpu], mode, prof, layout, creates, ranked))
        if not out:
            where = f"{key[0]}/gpu{key[1]}" if key is not None else "no GPU"
            self._waiting_note[job.id] = f"bound to {where} (random binding), which is full"
        return out

    def rank(self, job: JobSpec, cand: SharingCandidate) -> None:
        cand.tier, cand.est_s, cand.why = 0, self.expected_s(job, cand), "random pick"

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        self._rng = rng  # the draws happen while listing candidates (``draw``)
        return super().sort_queue(pending, view, rng)

    def draw(self, job: JobSpec, offers: list[tuple[Any, ...]]) -> list[Candidate]:
        """Uniform over GPUs: a pool in proportion to its size, a GPU in it, then one of the
        modes offered on that pool. Only the drawn candidate is built."""
        if self.params.get("bind"):
            offers = self.bound_offers(job, offers)
        if not offers:
            return []
        by_pool: dict[int, list[tuple[Any, ...]]] = {}
        for o in offers:
            by_pool.setdefault(id(o[1]), []).append(o)
        groups = list(by_pool.values())
        total = sum(len(g[0][1]) for g in groups)
        rng = self._rng
        draw = rng.randrange(total)
        bound = bool(self.params.get("bind"))
        for group in groups:
            size = len(group[0][1])
            if draw < size:
                gpu, pool, mode, prof, layout, creates, ranked = group[rng.randrange(len(group))]
                if not bound and size > 1 and mode != MIG and pool[draw].node.has_cores(job.cpus):
                    gpu = pool[draw]
                chosen = self._materialise(gpu, pool, mode, prof, layout, creates, ranked)
                chosen.why = (
                    f"random binding (seed {self.params['bind_seed']}) to this GPU, mode 1 of "
                    f"{len(group)} it allows"
                    if bound
                    else f"random pick: GPU 1 of {total} that can take it, mode 1 of "
                    f"{len(group)} it allows"
                )
                return [chosen]
            draw -= size
        return []  # pragma: no cover - the draw is below the total

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        if job.gpus != 1 or not all(isinstance(c, SharingCandidate) for c in cands):
            return FrameworkPolicy.pick(self, job, cands, view, rng)
        chosen = cands[0] if cands else None
        if chosen is not None:
            assert isinstance(chosen, SharingCandidate)
            self.commit(job, chosen)
        return chosen
