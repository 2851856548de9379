"""Elastic data-parallel jobs in the cluster simulator (ALGORITHMS.md §6; docs/elastic.md).

An elastic job (a worker range and a measured curve for its job type:
``scheduler.simulator.elastic``) runs at the curve's throughput for its worker count, local batch
and consolidation, times its slowest rank's speed; every ``window_steps`` reference steps it
produces a statistics window folded into ``RunningJob.elastic`` while the engine is measuring
(none once it converged, until a rank turns straggler). ``SET_WORKERS`` grows it onto idle GPUs
of its model (warm-up, then a regroup pause) or shrinks it; ``REPLACE_WORKERS`` warms a spare
that then takes the straggler's place. An action that cannot be applied is skipped and logged in
``SimResult.elastic_events``. ``ElasticJobs`` adds these steps to the shared simulator state
(``scheduler.simulator.base``); the event loop (``scheduler.simulator.engine``) calls them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from scheduler import elastic as en
from scheduler.domain import Action, ActionKind, ClusterState, Placement
from scheduler.simulator.base import (
    EVENT_DP_READY,
    EVENT_DP_TIMER,
    EVENT_READY,
    SimulatorBase,
)
from scheduler.simulator.elastic import DataParallelJob, Transition, load_curve_table
from scheduler.simulator.results import ElasticEvent
from scheduler.simulator.state import RUNNING, SimGpu, SimJob


class ElasticJobs(SimulatorBase):
    """The simulator's steps for elastic data-parallel jobs (see the module docstring)."""

    def _curve_job(self, job: SimJob, model: str, pl: Placement) -> DataParallelJob | None:
        """The curve model of a job just placed (None: it runs on its profile's solo time)."""
        spec = job.spec
        elastic = spec.elastic_min is not None or spec.elastic_max is not None
        if spec.job_type is None or job.segments:
            return None
        if not (elastic or self.elastic_model.static_jobs):
            return None
        if self.curve_table is None:
            self.curve_table = load_curve_table(self.elastic_model.throughputs)
        if self.curve_table.curve(spec.job_type, model) is None:
            return None
        try:
            dp = DataParallelJob(
                spec,
                model,
                pl.gpu_count,
                pl.is_gang,
                self.curve_table,
                self.elastic_model,
                self.now,
                job.seq,
            )
        except ValueError:  # the curve has no point at this count
            return None
        dp.total *= job.work_factor
        return dp

    def _elastic_config(self, job: SimJob) -> en.ElasticConfig:
        """The engine settings the policy uses for ``job`` (its ``config``, with the step K
        its ``step_for`` gives), to know when a window makes a decision due; the engine's
        defaults for a policy without them."""
        cfg = getattr(self.policy, "config", None)
        if not isinstance(cfg, en.ElasticConfig):
            return en.ElasticConfig()
        step_for = getattr(self.policy, "step_for", None)
        rj = self.rj.get(job.spec.id)
        if callable(step_for) and rj is not None:
            # K depends on the job's first node only: asked once per (job, node), not at
            # every window (a snapshot of every node each time)
            key = (job.spec.id, rj.placement.node)
            k = self._step_k.get(key)
            if k is None:
                state = ClusterState(
                    now_s=self.now, nodes=self._nodes_snapshot(), pending=(), running=()
                )
                try:
                    k = self._step_k[key] = int(step_for(rj, state))
                except (KeyError, TypeError, ValueError):
                    return cfg
            if k >= 1 and k != cfg.scale_step_workers:
                return replace(cfg, scale_step_workers=k)
        return cfg

    def _dp_watch(self, job: SimJob) -> None:
        """After a warm-up or regroup: an elastic job measures (windows), a static one runs
        until its next persistent fault."""
        dp = job.dp
        if dp is None:
            return
        if dp.state is not None and dp.pending is None:
            dp.ranks.skip_blips(self.now)
            self._dp_window(job, dp)
        else:
            self._dp_steady(job, dp)

    def _dp_window(self, job: SimJob, dp: DataParallelJob) -> None:
        dp.streaming = True
        dp.timer += 1
        length = dp.start_window(self.now)
        self._push(self.now + length, EVENT_DP_TIMER, job, dp.timer)
        self.touched_jobs.add(job)

    def _dp_steady(self, job: SimJob, dp: DataParallelJob) -> None:
        """No window watched: the job runs at its current ranks' speed until the next fault."""
        dp.streaming = False
        dp.timer += 1
        dp.steady(self.now)
        nxt = dp.ranks.next_fault_s()
        if nxt < math.inf:
            self._push(max(nxt, self.now), EVENT_DP_TIMER, job, dp.timer)
        self.touched_jobs.add(job)

    def _on_dp_timer(self, job: SimJob, version: int) -> bool:
        """A window ends (fold it in; True if a decision is now due) or, unwatched, a rank
        turns straggler (an elastic job starts watching again)."""
        dp = job.dp
        if job.status != RUNNING or dp is None or version != dp.timer:
            return False
        self._advance(job)
        if dp.window is None:  # a fault while nobody watched
            if dp.state is not None and dp.pending is None and job.ready_at <= self.now:
                dp.steady(self.now)
                dp.ranks.skip_blips(self.now)
                self._dp_window(job, dp)
            else:
                self._dp_steady(job, dp)
            return False
        cfg = self._elastic_config(job)
        start = job.first_start if job.first_start is not None else self.now
        dp.end_window(self.now, job.progress * dp.total, cfg, start)
        self.rj_dirty.add(job)
        if dp.state is None or dp.declared is None:
            self._dp_steady(job, dp)
            return False
        decision = en.decide(dp.state, dp.declared, cfg)
        if decision.kind == en.DecisionKind.HOLD and (not decision.converged or dp.suspect):
            self._dp_window(job, dp)  # still measuring, or watching a potential straggler
            return False
        self._dp_steady(job, dp)
        return decision.kind != en.DecisionKind.HOLD

    def _elastic_event(self, job: SimJob, kind: str, w_from: int, w_to: int, text: str) -> None:
        self.elastic_events.append(ElasticEvent(self.now, job.spec.id, kind, w_from, w_to, text))

    def _idle_of_model(self, job: SimJob, n: int) -> list[SimGpu]:
        """Up to ``n`` idle GPUs of the job's model, its own nodes first, cluster order, none
        that the plan being applied places a job on (the ``elastic`` policy's order)."""
        own = {node.name for node in job.nodes}
        free = [
            g
            for node in self.nodes
            for g in node.gpus
            if not g.jobs
            and g.spec.model == job.model
            and (node.name, g.index) not in self.reserved
        ]
        free.sort(key=lambda g: g.node.name not in own)
        return free[:n]

    def _apply_elastic(self, job: SimJob, action: Action) -> bool:
        """SET_WORKERS / REPLACE_WORKERS on an elastic job (False: skipped, logged)."""
        dp = job.dp
        kind = str(action.kind)
        w = dp.workers if dp is not None else len(job.gpus)

        def skip(why: str, target: int = w) -> bool:
            self.ignored_actions += 1
            self._elastic_event(job, f"skipped {kind}", w, target, f"{why} ({action.explanation})")
            return False

        if job.status != RUNNING or dp is None or dp.state is None:
            return skip("not a running elastic job on a measured curve")
        if dp.pending is not None:
            return skip("a change is under way")
        if action.kind == ActionKind.REPLACE_WORKERS:
            try:
                ranks = tuple(sorted({int(r) for r in action.value or ()}))
            except (TypeError, ValueError):
                return skip(f"bad ranks {action.value!r}")
            if not ranks or ranks[0] < 0 or ranks[-1] >= w:
                return skip(f"ranks {ranks} are not ranks of its {w} workers")
            spares = self._idle_of_model(job, len(ranks))
            if len(spares) < len(ranks):
                return skip(f"no idle spare {job.model}: needs {len(ranks)}, {len(spares)} idle")
            self._dp_begin(
                job,
                dp,
                Transition(
                    "replace", w, ranks, list(spares), dp.local, action.explanation, self.now
                ),
            )
            self._elastic_event(job, kind, w, w, f"ranks {list(ranks)}: {action.explanation}")
            return True
        value = action.value if isinstance(action.value, Mapping) else {"workers": action.value}
        try:
            target = int(value["workers"])
            asked = value.get("local_batch")
            asked = int(asked) if asked else None
        except (KeyError, TypeError, ValueError):
            return skip(f"bad value {action.value!r}")
        if target == w:
            return False
        if target < 1:
            return skip(f"{target} workers", target)
        local = dp.local_for(target, asked)
        if target > w:
            extra = self._idle_of_model(job, target - w)
            if len(extra) < target - w:
                return skip(f"needs {target - w} idle {job.model}, {len(extra)} idle", target)
            spread = len({g.node for g in [*job.gpus[:w], *extra]}) > 1
            if not dp.can_run(target, spread, local):
                return skip(f"no measured throughput at {target} GPUs", target)
            self._dp_begin(
                job,
                dp,
                Transition("scale", target, (), list(extra), local, action.explanation, self.now),
            )
            self._elastic_event(job, kind, w, target, action.explanation)
            return True
        # shrink now: stragglers go first, then the last ranks
        cfg = self._elastic_config(job)
        ewma = dp.state.straggler_ewma
        order = sorted(range(w), key=lambda i: (ewma[i] >= cfg.straggler_threshold, -i))
        drop = set(order[: w - target])
        keep = [i for i in range(w) if i not in drop]
        gpus = [job.gpus[i] for i in keep]
        spread = len({g.node for g in gpus}) > 1
        if not dp.can_run(target, spread, local):
            return skip(f"no measured throughput at {target} GPUs", target)
        self._hold(job, gpus)
        self.freed_for_queue = True
        dp.ranks.keep(keep)
        dp.set_group(target, spread, local)
        state = en.changed(dp.state, target)
        dp.state = replace(state, straggler_ewma=tuple(ewma[i] for i in keep))
        self._elastic_event(job, kind, w, target, action.explanation)
        self._dp_regroup(job, dp)
        return True

    def _dp_begin(self, job: SimJob, dp: DataParallelJob, change: Transition) -> None:
        """Hold the new GPUs (or spares) while they warm up; the job trains on meanwhile."""
        self._hold(job, [*job.gpus, *change.gpus])  # type: ignore[list-item]
        dp.pending = change
        dp.serial += 1
        if dp.state is not None:
            dp.state = en.begin_transition(dp.state)
        self._push(self.now + self.elastic_model.warmup_s, EVENT_DP_READY, job, dp.serial)
        self._dp_steady(job, dp)
        self.rj_dirty.add(job)

    def _on_dp_ready(self, job: SimJob, version: int) -> None:
        """The warm-up is over: the new group forms (a regroup pause), the straggler leaves."""
        dp = job.dp
        if job.status != RUNNING or dp is None or version != dp.serial or dp.pending is None:
            return
        self._advance(job)
        change, dp.pending = dp.pending, None
        w = dp.workers
        new: list[SimGpu] = list(change.gpus)  # type: ignore[arg-type]
        active = job.gpus[:w]
        if change.kind == "replace":
            for rank, spare in zip(change.ranks, new, strict=True):
                active[rank] = spare
            self._hold(job, active)
            dp.ranks.heal(change.ranks, self.now)
            dp.set_group(w, len({g.node for g in active}) > 1, dp.local)
            if dp.state is not None:
                dp.state = en.replaced(dp.state, change.ranks)
            text = f"ranks {list(change.ranks)} replaced by warmed spares"
        else:
            gpus = [*active, *new]
            self._hold(job, gpus)
            dp.ranks.add(len(new), self.now)
            dp.set_group(change.target, len({g.node for g in gpus}) > 1, change.local_batch)
            if dp.state is not None:
                dp.state = en.changed(dp.state, change.target)
            text = f"{w} -> {change.target} workers, local batch {dp.local}"
        self._elastic_event(job, "applied", w, dp.workers, f"{text} ({change.reason})")
        self._dp_regroup(job, dp)

    def _dp_regroup(self, job: SimJob, dp: DataParallelJob) -> None:
        """The group changes: no training for ``regroup_s``, then the job measures again."""
        job.ready_at = max(job.ready_at, self.now + self.elastic_model.regroup_s)
        self._push(job.ready_at, EVENT_READY, job)
        self._dp_steady(job, dp)
        self.rj_dirty.add(job)
