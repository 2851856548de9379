"""Policy settings that cannot break scheduling (issue 18, part 1).

``validate_policy_settings(name, params)`` says what is wrong with a policy configuration before
it is saved, per field: an unknown policy, an unknown parameter, a value of the wrong type or out
of its documented range, or a configuration the policy itself refuses when it is built
(``build_policy``) or when it is tried once on the current queue. The admin's policy form uses
it; the scheduling loop can call it too before switching to a newly saved configuration (and
keep the last good one when it fails).

``policy_parameters(name)`` lists a policy's documented parameters with their types, ranges,
defaults and help, for the admin form and the docs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from portal.core.snapshot import build_snapshot
from scheduler.domain import ClusterState
from scheduler.interference import INTERFERENCE_MODELS
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import available_policies, build_policy, policy_class

BOOL, INT, FLOAT, CHOICE, MAPPING = "bool", "int", "float", "choice", "mapping"
TEXT = "text"  # free text (e.g. coscheml's model: "active", "builtin" or "file:PATH")


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One documented parameter: ``kind`` is bool, int, float, choice, mapping or text."""

    name: str
    kind: str
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    default: Any = None

    def describe(self) -> str:
        """Type and range in words, e.g. "integer, 1 to 64"."""
        words = {
            BOOL: "true/false",
            INT: "integer",
            FLOAT: "number",
            MAPPING: "JSON object",
            TEXT: "text",
        }
        text = words.get(self.kind, "one of " + ", ".join(self.choices))
        if self.minimum is not None and self.maximum is not None:
            text += f", {self.minimum:g} to {self.maximum:g}"
        elif self.minimum is not None:
            text += f", at least {self.minimum:g}"
        if self.nullable:
            text += ", or null"
        return text


def _placement_policies() -> tuple[str, ...]:
    return tuple(p for p in available_policies() if "exec_plan" not in p)


_INTERFERENCE = tuple(sorted(INTERFERENCE_MODELS))

# The parameters the policies document (their module docstrings; ALGORITHMS.md for the maths).
_KNOWN: dict[str, ParamSpec] = {
    spec.name: spec
    for spec in (
        ParamSpec("backfill", BOOL, "let later jobs go past one that does not fit"),
        ParamSpec(
            "reserve",
            BOOL,
            "with backfill: the first waiting multi-GPU job gets a reservation (EASY "
            "backfilling) that later jobs may not delay",
        ),
        ParamSpec(
            "cpu_jobs_on_gpu_nodes",
            BOOL,
            "a job asking no GPU may run on a GPU node's spare cores (one core kept per idle "
            "GPU), with every GPU device hidden from it",
        ),
        ParamSpec("max_jobs_per_gpu", INT, "co-location limit under MPS and time-slicing", 1, 64),
        ParamSpec(
            "share_mode",
            CHOICE,
            "mode for an idle GPU a co-locating policy starts sharing",
            choices=("auto", "mps", "time_slicing", "mig"),
        ),
        ParamSpec(
            "profiled_models_only",
            BOOL,
            "a job with profiled GPU times runs only on those GPU models",
        ),
        ParamSpec(
            "weights",
            MAPPING,
            "scorer name -> weight (null: 1 each)",
            nullable=True,
        ),
        ParamSpec(
            "interference",
            CHOICE,
            "interference model whose predicted slowdown co-locating policies quote",
            choices=_INTERFERENCE,
            nullable=True,
        ),
        ParamSpec(
            "interference_params", MAPPING, "parameters of that interference model", nullable=True
        ),
        ParamSpec(
            "colocation_check",
            CHOICE,
            "asked whether two jobs may share a GPU at all: knowledge (the cluster's pair "
            "prior and observed co-runs) or an interference model (null: no check)",
            choices=("knowledge", *_INTERFERENCE),
            nullable=True,
        ),
        ParamSpec(
            "unknown_util_pct", FLOAT, "GPU utilisation assumed for an unprofiled job", 0, 100
        ),
        ParamSpec(
            "unknown_similarity", FLOAT, "similarity assumed when a signature is unknown", 0, 1
        ),
        ParamSpec("measured_signatures", BOOL, "use measured signatures where they exist"),
        ParamSpec("features", MAPPING, "feature -> weight C_k of the GPU placement rate"),
        ParamSpec(
            "gpu_share_slowdown",
            FLOAT,
            "slowdown assumed for a job sharing a GPU (null: from the interference model)",
            1,
            100,
            nullable=True,
        ),
        ParamSpec(
            "exact_split_limit",
            INT,
            "largest queue for which the GPU/CPU split is searched exactly",
            1,
            100_000,
        ),
        ParamSpec(
            "placement",
            CHOICE,
            "the placement policy the execution plan wraps",
            choices=_placement_policies(),
        ),
        ParamSpec("placement_params", MAPPING, "parameters of the wrapped policy", nullable=True),
        ParamSpec("interval_s", FLOAT, "seconds between execution-plan checks", 0.1, 3600),
        ParamSpec("alpha_mb", FLOAT, "memory margin added to a growing job's need (MB)", 0, 1e6),
        ParamSpec(
            "lookahead_intervals",
            FLOAT,
            "how many intervals ahead memory growth is predicted",
            0,
            1000,
        ),
        ParamSpec(
            "priority_features", MAPPING, "feature weights of the pause priority", nullable=True
        ),
        # hetero_srtf (scheduler/policies/hetero_srtf.py; docs/policies.md)
        ParamSpec(
            "aging",
            FLOAT,
            "hetero_srtf: weight of a job's age (in multiples of its own length) in its "
            "shortest-remaining-time key; above 0 no job starves",
            0,
            100,
        ),
        ParamSpec(
            "preemption_cost_s",
            FLOAT,
            "hetero_srtf: estimated checkpoint-and-restart seconds; a preemption or move must "
            "save more than this",
            0,
            1e7,
        ),
        ParamSpec(
            "preempt_margin",
            FLOAT,
            "hetero_srtf: a waiting job must be this fraction shorter than a running one to "
            "preempt it",
            0,
            0.99,
        ),
        ParamSpec(
            "max_preemptions",
            INT,
            "hetero_srtf: preemptions (moves included) of one job before it keeps its GPUs, "
            "whatever its length",
            0,
            10_000,
        ),
        ParamSpec(
            "pack_threshold",
            FLOAT,
            "hetero_srtf: pack two jobs on a GPU under MPS when their estimated pair throughput "
            "reaches this many jobs' worth (0: never)",
            0,
            2,
        ),
        ParamSpec(
            "pack_sigmas",
            FLOAT,
            "hetero_srtf: packing takes each job's estimated co-run speed this many standard "
            "deviations below the estimate (0: the estimate itself)",
            0,
            5,
        ),
        ParamSpec(
            "ftf_cap",
            FLOAT,
            "hetero_srtf: jobs whose predicted finish-time-fairness ratio reaches this go first "
            "(0: off)",
            0,
            1e6,
        ),
        ParamSpec(
            "ftf_sigmas",
            FLOAT,
            "hetero_srtf: the fairness cap weighs a job's age as if its declared length were "
            "this many standard deviations too long (0: as declared)",
            0,
            5,
        ),
        ParamSpec(
            "tick_s",
            FLOAT,
            "hetero_srtf: also re-plan every so many seconds (0: on events)",
            0,
            1e7,
        ),
        ParamSpec(
            "replan_limit",
            INT,
            "hetero_srtf: above this many running jobs, only those a waiting job could preempt "
            "are re-planned",
            0,
            10_000_000,
        ),
        # the peers (scheduler/policies/peer_base.py and the five peers; docs/policies.md)
        ParamSpec(
            "round_s",
            FLOAT,
            "peers: seconds between decision points (preemptions, moves; Gavel's round, "
            "Themis' lease); 0: every call",
            0,
            1e7,
        ),
        ParamSpec(
            "queue_threshold_gpu_s",
            FLOAT,
            "tiresias: attained GPU-seconds that end the first queue (each next one is 10x)",
            1e-3,
            1e9,
        ),
        ParamSpec("queues", INT, "tiresias: number of priority queues of attained service", 1, 20),
        ParamSpec(
            "promote_knob",
            FLOAT,
            "tiresias: a job waiting this many times its last run goes back to the first "
            "queue (0: off)",
            0,
            1e6,
        ),
        ParamSpec(
            "ftf_iterations",
            INT,
            "gavel: bisection steps of the finish-time-fairness LP",
            1,
            100,
        ),
        ParamSpec(
            "alpha",
            FLOAT,
            "allox: fairness knob, the share of users (least served first) whose jobs enter "
            "the matching (1: all)",
            1e-3,
            1,
        ),
        ParamSpec(
            "max_jobs",
            INT,
            "allox: most waiting jobs (longest waiting first) matched per call",
            1,
            1_000_000,
        ),
        ParamSpec(
            "f",
            FLOAT,
            "themis: fairness knob; the 1 - f share of jobs with the worst finish-time "
            "fairness bid for freed GPUs",
            0,
            0.99,
        ),
        ParamSpec(
            "churn_budget",
            FLOAT,
            "hetero_srtf: at most this share of running jobs (and at least churn_min) requeued "
            "per cycle (1: no limit)",
            0,
            1,
        ),
        ParamSpec(
            "churn_min",
            INT,
            "hetero_srtf: jobs a cycle may always requeue, however small the cluster",
            1,
            10_000_000,
        ),
        ParamSpec(
            "max_restart_share",
            FLOAT,
            "hetero_srtf: a job keeps its GPUs once its restarts reach this share of its "
            "estimated run time (0: the preemption count alone)",
            0,
            10,
        ),
        ParamSpec(
            "unknown_lengths",
            CHOICE,
            "hetero_srtf: jobs that declare no length (no profile): gittins ranks them by the "
            "lengths of completed jobs like them and their attained service (least attained "
            "service without a history); fifo leaves them to first come first served",
            choices=("gittins", "fifo"),
        ),
        ParamSpec(
            "unknown_length_s",
            FLOAT,
            "hetero_srtf: seconds a job of unknown length is taken to need while the cluster "
            "has no history for it",
            1,
            1e9,
        ),
        ParamSpec(
            "las_quantum_s",
            FLOAT,
            "hetero_srtf: first step of a job's discretised attained service (then doubling); "
            "0: continuous",
            0,
            1e9,
        ),
        # slowdown_dr (paper 000, Algorithm 1; docs/slowdown.md)
        ParamSpec(
            "sd_threshold",
            FLOAT,
            "SD_th: data ratios move only while SD_max_diff is at least this (unitless)",
            0,
            10,
        ),
        ParamSpec(
            "util_threshold_pct",
            FLOAT,
            "Util_th: a larger utilisation gap (percentage points) between a job's busiest GPU "
            "and the least utilised one moves its batch by remaining capacity, else by Slow-Down",
            0,
            100,
        ),
        # quota (docs/projects.md)
        ParamSpec(
            "base",
            CHOICE,
            "the policy that places jobs inside the project quotas",
            choices=tuple(p for p in _placement_policies() if p != "quota"),
        ),
        ParamSpec("base_params", MAPPING, "parameters of that policy", nullable=True),
        ParamSpec("reclaim", BOOL, "requeue borrowed jobs (newest first) for a guarantee"),
        ParamSpec("fair_share", BOOL, "order jobs by decayed past usage after priority"),
        ParamSpec("max_rounds", INT, "runs of the base policy per cycle after refusals", 1, 20),
        # elastic (ALGORITHMS.md §6)
        ParamSpec(
            "scaling_threshold",
            FLOAT,
            "elastic: scale only while the scaling efficiency S exceeds this (paper: 0.1)",
            -10,
            10,
        ),
        ParamSpec(
            "scale_step_workers",
            INT,
            "elastic: workers added or removed per step, K (0: the GPUs of the job's node)",
            0,
            1024,
        ),
        ParamSpec(
            "scale_interval_batches",
            INT,
            "elastic: mini-batches measured at a worker count before the next decision",
            20,
            1_000_000,
        ),
        ParamSpec(
            "straggler_threshold",
            FLOAT,
            "elastic: a rank whose EWMA of throughput / median falls below this is replaced",
            0,
            1,
        ),
        ParamSpec(
            "straggler_ewma_alpha",
            FLOAT,
            "elastic: weight of the newest window in the straggler average (0 excluded)",
            0.001,
            1,
        ),
        ParamSpec(
            "gpu_cost_per_hour",
            FLOAT,
            "elastic: cost of one GPU-hour in the utility-vs-cost condition",
            0,
            1e6,
        ),
        ParamSpec(
            "lateness_value_per_hour",
            FLOAT,
            "elastic: what each hour past a deadline costs a deadline job",
            0,
            1e9,
        ),
        ParamSpec(
            "yield_to_queue",
            BOOL,
            "elastic: step grown jobs down (lowest measured S first) so a waiting job can start, "
            "and grow none onto GPUs a waiting job could be given",
        ),
    )
}


# The framework's estimate and the parameters of the sharing (ALGORITHMS.md §3, §4) and
# Co-scheML (§2) policies, from their module docstrings.
_KNOWN.update(
    (spec.name, spec)
    for spec in (
        ParamSpec(
            "unconsolidated_speed",
            FLOAT,
            "speed of a multi-GPU job spread over several nodes relative to one node, where its "
            "profile has no such time (an estimate: 0.74 is the median of Gavel's measurements)",
            0.01,
            10,
        ),
        ParamSpec(
            "fallback",
            BOOL,
            "when every GPU of the sharing mode the criteria prefer is full, take the best other "
            "mode instead of waiting (off: wait, as the paper's pods do)",
        ),
        ParamSpec(
            "mig_relayout_s",
            FLOAT,
            "expected cost of creating a MIG instance (s), so GPUs that have one are preferred",
            0,
            3600,
        ),
        ParamSpec(
            "sensitivity_high",
            FLOAT,
            "sensitivity (speed-up from the smallest MIG instance to the whole GPU) from which a "
            "job counts as highly sensitive",
            1,
            100,
        ),
        ParamSpec(
            "cm_threshold",
            FLOAT,
            "C/M ratio (SM over memory utilisation) from which a job counts as compute-intensive "
            "(C); below it, memory-intensive (M)",
            0,
            1000,
        ),
        ParamSpec(
            "bind",
            BOOL,
            "bind each job to one GPU drawn at random (from bind_seed and its id) and let it wait "
            "for that GPU, like a pod sent to a random node",
        ),
        ParamSpec("bind_seed", INT, "seed of that random binding", 0, 2**31 - 1),
        ParamSpec(
            "model",
            TEXT,
            "the trained interference model: active (the one activated in the portal, else the "
            "built-in one), builtin, or file:PATH of a saved model",
        ),
        ParamSpec(
            "predictor",
            CHOICE,
            "an interference model used instead of the trained one (null: the trained model)",
            choices=_INTERFERENCE,
            nullable=True,
        ),
        ParamSpec(
            "predictor_params", MAPPING, "parameters of that interference model", nullable=True
        ),
        ParamSpec(
            "memory_margin_mb",
            FLOAT,
            "safety margin (MB) added to a pair's memory when checking that it fits the GPU",
            0,
            1e6,
        ),
        ParamSpec(
            "max_predicted_slowdown",
            FLOAT,
            "never pair jobs whose predicted slowdown is above this (null: any pair may be taken)",
            1,
            1000,
            nullable=True,
        ),
        ParamSpec(
            "min_feasible",
            FLOAT,
            "least probability of co-running at all the learned feasibility classifier must give "
            "a pair (higher: fewer out-of-memory restarts, less co-location)",
            0,
            1,
        ),
        ParamSpec("group_size", INT, "kernels per co-run group", 1, 64),
        ParamSpec(
            "join_running",
            BOOL,
            "also let a kernel join a GPU whose group is still running when the rules hold",
        ),
        ParamSpec(
            "max_gflops",
            FLOAT,
            "GFLOPS a co-run group may demand in all (null: the GPU's peak)",
            1,
            1e7,
            nullable=True,
        ),
        ParamSpec(
            "max_regs",
            INT,
            "registers per SM a co-run group may take at its kernels' saturation points",
            1,
            10_000_000,
        ),
        ParamSpec(
            "max_smem_bytes",
            INT,
            "shared memory per SM (bytes) a co-run group may take at its saturation points",
            1,
            100_000_000,
        ),
        ParamSpec(
            "max_tbs",
            INT,
            "thread blocks per SM a co-run group may take at its saturation points",
            1,
            1024,
        ),
        ParamSpec(
            "base_epc",
            FLOAT,
            "eligible warps per cycle above which a compute kernel counts as busy (rule 5)",
            0,
            100,
        ),
        ParamSpec(
            "max_epc",
            FLOAT,
            "eligible warps per cycle above which a compute kernel admits no busy partner (rule 5)",
            0,
            100,
        ),
        ParamSpec(
            "l1_threshold",
            FLOAT,
            "L1 transactions below which a kernel of another class may join an l1 kernel (rule 3)",
            0,
            1e6,
        ),
        ParamSpec(
            "pairing", BOOL, "run stage 3, the kernel-class pairing of co-runners (off: skip it)"
        ),
    )
)


def _guess(name: str, default: Any) -> ParamSpec:
    """A parameter no table above documents: typed by its default."""
    if isinstance(default, bool):
        return ParamSpec(name, BOOL, "")
    if isinstance(default, int):
        return ParamSpec(name, INT, "")
    if isinstance(default, float):
        return ParamSpec(name, FLOAT, "")
    if isinstance(default, str):
        return ParamSpec(name, CHOICE, "", choices=(default,))
    return ParamSpec(name, MAPPING, "", nullable=True)


def policy_defaults_of(name: str) -> dict[str, Any]:
    """Every parameter ``name`` takes with its default: the class's own and, for an execution
    plan, those of the placement policy it wraps (it passes them on)."""
    cls = policy_class(name)
    defaults = dict(cls.defaults)
    inner = defaults.get("placement") if "exec_plan" in name else None
    if name == "quota":  # the quota wrapper passes them on to its base policy too
        inner = defaults.get("base")
    if isinstance(inner, str) and inner in available_policies():
        for key, value in policy_class(inner).defaults.items():
            defaults.setdefault(key, value)
    return defaults


def policy_parameters(name: str) -> list[ParamSpec]:
    """The documented parameters of policy ``name`` (sorted by name), with their defaults."""
    out = []
    for key, default in sorted(policy_defaults_of(name).items()):
        spec = _KNOWN.get(key) or _guess(key, default)
        nullable = spec.nullable or default is None
        out.append(
            ParamSpec(
                spec.name,
                spec.kind,
                spec.help,
                spec.minimum,
                spec.maximum,
                spec.choices,
                nullable,
                default,
            )
        )
    return out


def check_value(spec: ParamSpec, value: Any) -> str | None:
    """Why ``value`` does not fit ``spec`` (None: it does)."""
    if value is None:
        return None if spec.nullable else "must not be null"
    if spec.kind == BOOL:
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if spec.kind in (INT, FLOAT):
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "a whole number" if spec.kind == INT else "a number"
            return f"must be {kind}, got {value!r}"
        if spec.kind == INT and isinstance(value, float) and not value.is_integer():
            return f"must be a whole number, got {value!r}"
        if not math.isfinite(value):
            return "must be a finite number"
        if spec.minimum is not None and value < spec.minimum:
            return f"must be at least {spec.minimum:g}, got {value:g}"
        if spec.maximum is not None and value > spec.maximum:
            return f"must be at most {spec.maximum:g}, got {value:g}"
        return None
    if spec.kind == TEXT:
        if not isinstance(value, str) or not value.strip():
            return f"must be non-empty text, got {value!r}"
        return None
    if spec.kind == CHOICE:
        if value not in spec.choices:
            return f"must be one of {', '.join(spec.choices)}, got {value!r}"
        return None
    if not isinstance(value, dict):
        return f"must be a JSON object, got {value!r}"
    return None


def _trial_state() -> ClusterState:
    """The current cluster and queue as the loop would hand them to the policy (an empty
    cluster when they cannot be read)."""
    try:
        return build_snapshot().state
    except Exception:  # a trial only: the settings are still checked on an empty cluster
        return ClusterState(now_s=0.0, nodes=(), pending=())


def validate_policy_settings(
    name: str, params: Mapping[str, Any] | None, *, trial: bool = True
) -> dict[str, str]:
    """What is wrong with running policy ``name`` with ``params``: field -> message, where the
    field is ``policy``, ``params`` or a parameter's name. Empty: the policy builds and (with
    ``trial``) plans one cycle of the current queue without an error."""
    known = available_policies()
    try:
        policy_class(name)
    except PolicyError:
        return {"policy": f"unknown policy {name!r}; choose one of {', '.join(known)}"}
    except Exception as exc:  # a registered policy whose module does not load
        return {"policy": f"policy {name!r} cannot be loaded: {exc}"}
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        return {"params": "must be a JSON object of parameter -> value"}
    specs = {spec.name: spec for spec in policy_parameters(name)}
    errors: dict[str, str] = {}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        errors["params"] = (
            f"policy {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(specs)) or 'none'}"
        )
    for key, value in params.items():
        if key in specs:
            problem = check_value(specs[key], value)
            if problem:
                errors[key] = problem
    if errors:
        return errors
    try:
        policy = build_policy(name, dict(params))
    except Exception as exc:  # PolicyError, or a TypeError/ValueError of a bad combination
        return {"params": f"the policy refuses these parameters: {exc}"}
    if trial:
        try:
            policy.schedule(_trial_state(), random.Random(0))  # noqa: S311  (a seeded trial)
        except Exception as exc:
            return {"params": f"the policy fails on the current queue: {type(exc).__name__}: {exc}"}
    return {}
