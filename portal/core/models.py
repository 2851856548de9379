"""Cosched's data model: profiles, cluster inventory, jobs and their lifecycle, metrics, policy.

Units follow ``scheduler.domain``: seconds, MB, percent, GB/s, GFLOPS. Derived classes (compute /
memory / l1, C / M, small / medium / big) are not stored: ``scheduler.classes`` computes them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from portal.core.states import JobState

JOB_KINDS = [
    ("dl-train", "DL training"),
    ("dl-infer", "DL inference"),
    ("hpc", "HPC"),
    ("other", "Other"),
]
#: How ``Job.failure_reason`` begins when the job ran past its time limit.
TIME_LIMIT_REASON = "time limit"
SHARING_MODES = [
    ("exclusive", "Exclusive"),
    ("time_slicing", "Time-slicing"),
    ("mps", "MPS"),
    ("mig", "MIG"),
]


class ApplicationProfile(models.Model):
    """What an application needs and how it behaves, measured offline (ALGORITHMS.md §1-§4)."""

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        APPROVED = "approved", "Approved"
        RETIRED = "retired", "Retired"

    class Source(models.TextChoices):
        MANUAL = "manual", "Manual"
        IMPORTED = "imported", "Imported"
        MONITORED = "monitored", "Monitored"

    name = models.CharField(max_length=100)
    version = models.CharField(max_length=40, default="1")
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=JOB_KINDS, default="other")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MANUAL)

    # Input parameters the profile was measured with
    batch_size = models.PositiveIntegerField(null=True, blank=True)
    image_size = models.PositiveIntegerField(null=True, blank=True, help_text="pixels per side")
    dataset = models.CharField(max_length=100, blank=True)
    args = models.JSONField(default=dict, blank=True, help_text="free-form input parameters")

    # §1: run times and memory
    cpu_time_s = models.FloatField(null=True, blank=True, help_text="solo run time on a CPU node")
    gpu_memory_max_mb = models.FloatField(null=True, blank=True)
    gpu_memory_avg_mb = models.FloatField(null=True, blank=True)

    # §2: utilisation metrics (003, Table 1)
    gpu_util_pct = models.FloatField(null=True, blank=True)
    sm_efficiency_pct = models.FloatField(null=True, blank=True)
    warp_efficiency_pct = models.FloatField(null=True, blank=True)
    ipc = models.FloatField(null=True, blank=True)
    occupancy_pct = models.FloatField(null=True, blank=True)
    mem_util_pct = models.FloatField(null=True, blank=True)
    h2d_gbps = models.FloatField(null=True, blank=True, help_text="host-to-device PCIe GB/s")
    d2h_gbps = models.FloatField(null=True, blank=True, help_text="device-to-host PCIe GB/s")
    gld_gbps = models.FloatField(null=True, blank=True, help_text="global load throughput GB/s")
    gst_gbps = models.FloatField(null=True, blank=True, help_text="global store throughput GB/s")
    dram_bw_gbps = models.FloatField(null=True, blank=True, help_text="DRAM bandwidth demand")
    gflops = models.FloatField(null=True, blank=True, help_text="compute demand")

    # §3: stall reasons (percent of stalls) and kernel resources (003, Table 7)
    stall_exec_dependency_pct = models.FloatField(null=True, blank=True)
    stall_instruction_fetch_pct = models.FloatField(null=True, blank=True)
    stall_memory_dependency_pct = models.FloatField(null=True, blank=True)
    stall_texture_pct = models.FloatField(null=True, blank=True)
    stall_synchronization_pct = models.FloatField(null=True, blank=True)
    stall_other_pct = models.FloatField(null=True, blank=True)
    epc = models.FloatField(null=True, blank=True, help_text="eligible warps per cycle")
    registers_per_block = models.PositiveIntegerField(null=True, blank=True)
    smem_per_block_bytes = models.PositiveIntegerField(null=True, blank=True)
    l1_transactions = models.FloatField(null=True, blank=True)
    saturation_tbs_per_sm = models.PositiveIntegerField(null=True, blank=True)

    # §4: job descriptors
    cm_ratio = models.FloatField(null=True, blank=True, help_text="SM util / memory util")
    sensitivity = models.FloatField(null=True, blank=True)
    # Where the numbers come from: field (or "gpu_time_s.<model>") -> source, e.g. a table of a
    # paper, a measured data set, or an estimate and its method; shown on the profile page.
    sources = models.JSONField(default=dict, blank=True)

    # The time limit of jobs using this profile that do not give one (scheduler.durations).
    default_time_limit_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="seconds; jobs that give no time limit get this one"
    )

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="profile_name_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class ProfileGpuTime(models.Model):
    """Solo run time of a profile on one GPU model (catalogue name, e.g. ``V100``)."""

    profile = models.ForeignKey(
        ApplicationProfile, on_delete=models.CASCADE, related_name="gpu_times"
    )
    gpu_model = models.CharField(max_length=40)
    time_s = models.FloatField()

    class Meta:
        ordering = ["gpu_model"]
        constraints = [
            models.UniqueConstraint(fields=["profile", "gpu_model"], name="gpu_time_unique")
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model}: {self.time_s:g} s"


class ProfileMemoryStep(models.Model):
    """A memory phase (ALGORITHMS.md §1 ``step_j``): from ``start_fraction`` of the run on, GPU
    memory grows from ``from_mb`` to ``to_mb``."""

    profile = models.ForeignKey(
        ApplicationProfile, on_delete=models.CASCADE, related_name="memory_steps"
    )
    index = models.PositiveIntegerField()
    start_fraction = models.FloatField(help_text="0..1 of the run at which this step begins")
    from_mb = models.FloatField()
    to_mb = models.FloatField()

    class Meta:
        ordering = ["index"]
        constraints = [
            models.UniqueConstraint(fields=["profile", "index"], name="memory_step_unique")
        ]

    def __str__(self) -> str:
        return f"step {self.index}: {self.from_mb:g}-{self.to_mb:g} MB"


class Node(models.Model):
    class Kind(models.TextChoices):
        CPU = "cpu", "CPU"
        GPU = "gpu", "GPU"

    class Status(models.TextChoices):
        UP = "up", "Up"
        DOWN = "down", "Down"
        DRAINING = "draining", "Draining"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    cores = models.PositiveIntegerField(default=1)
    memory_mb = models.PositiveIntegerField(default=0)
    backend = models.CharField(
        max_length=16, default="virtual", help_text="GPU backend: virtual (no GPU) or nvml"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UP)
    last_heartbeat = models.DateTimeField(
        null=True, blank=True, help_text="when its agent last synced"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The node's lease (docs/reliability.md): renewed by every sync of its agent; the agent's
    # runners stop its jobs when it runs out, and the portal starts them again elsewhere only
    # after it ran out plus COSCHED_LEASE_MARGIN_S.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    address = models.CharField(
        max_length=255, blank=True, help_text="where other nodes reach it (gang MASTER_ADDR)"
    )
    # The newest agent request applied (workers.protocol: requests apply in this order only).
    sync_seq = models.BigIntegerField(default=0)
    agent_instance = models.CharField(max_length=64, blank=True)
    # How the node keeps its jobs apart, as its agent reported at registration
    # (workers.protocol.NodeInfo.isolation: [{"what", "level", "text"}]; [] when not said).
    isolation = models.JSONField(default=list, blank=True)
    # Node operations (``portal.core.node_ops``, like scontrol): why staff drained it or took
    # it down, who and when. ``held_down``: taken down by staff, so its agent's next sync does
    # not bring it back up (only a resume does).
    state_reason = models.CharField(max_length=500, blank=True)
    state_changed_by = models.CharField(max_length=100, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    held_down = models.BooleanField(default=False)
    # The node protocol version its agent spoke at its last sync (0: not synced yet); one older
    # than the portal's is accepted during a rolling upgrade and shown on the cluster page.
    agent_version = models.PositiveSmallIntegerField(default=0)
    # The container runtimes its agent reported (NodeInfo.container_runtimes: "podman",
    # "apptainer"); container jobs are placed only on nodes with one (docs/containers.md).
    container_runtimes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name"]

    @property
    def agent_outdated(self) -> bool:
        """Its agent spoke an older protocol than the portal's at its last sync (accepted
        during a rolling upgrade: upgrade the agent)."""
        from workers.protocol import PROTOCOL_VERSION

        return 0 < self.agent_version < PROTOCOL_VERSION

    def isolation_rows(self) -> list[dict[str, str]]:
        """``isolation`` with each aspect's label and CSS class (``iso-ok``, ``iso-weak``,
        ``iso-na``), for the cluster page."""
        from workers.protocol import ISOLATION_ASPECTS

        return [
            {
                **a,
                "label": ISOLATION_ASPECTS.get(a.get("what", ""), a.get("what", "")),
                "css": "iso-" + str(a.get("level", "")).replace("/", ""),
            }
            for a in self.isolation or []
            if isinstance(a, dict)
        ]

    def __str__(self) -> str:
        return self.name


class NodeToken(models.Model):
    """The credential a node agent syncs with (``manage.py node_token create NAME``): stored
    hashed (SHA-256) like the users' API tokens, valid for one node name, revocable."""

    node_name = models.CharField(max_length=100, db_index=True)
    prefix = models.CharField(max_length=16, help_text="first characters of the key, for display")
    key_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_name", "-created_at"]

    def __str__(self) -> str:
        return f"{self.node_name} ({self.prefix}…)"


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=40, help_text="catalogue name, e.g. V100, A30")
    architecture = models.CharField(max_length=40, blank=True)
    memory_mb = models.PositiveIntegerField()
    sm_count = models.PositiveIntegerField(default=0)
    sharing_modes = models.JSONField(default=list, blank=True)
    mig_profiles = models.JSONField(
        default=list,
        blank=True,
        help_text='e.g. [{"name": "1g.6gb", "slices": 1, "memory_mb": 6144}]',
    )
    current_mode = models.CharField(max_length=16, choices=SHARING_MODES, default="exclusive")
    mig_layout = models.JSONField(
        default=list,
        blank=True,
        help_text='MIG instances configured now, by profile, e.g. ["2g.12gb", "1g.6gb", "1g.6gb"]',
    )

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_node_index")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} ({self.model})"


DEVICE_CHOICES = [
    ("gpu", "GPU only"),
    ("auto", "GPU, or a CPU node where the policy finds it better"),
    ("cpu", "CPU only"),
]


class Job(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs"
    )
    name = models.CharField(max_length=200)
    # Every job belongs to one project (docs/projects.md); filled with the owner's default
    # project on save when the writer names none.
    project = models.ForeignKey(
        "teams.Project", null=True, blank=True, on_delete=models.RESTRICT, related_name="jobs"
    )
    command = models.TextField(blank=True)
    container_image = models.CharField(max_length=300, blank=True)
    profile = models.ForeignKey(
        ApplicationProfile, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    params = models.JSONField(default=dict, blank=True)
    kind = models.CharField(max_length=16, choices=JOB_KINDS, default="other")

    # Resources asked
    gpus = models.PositiveIntegerField(default=0)
    gpu_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    cpus = models.PositiveIntegerField(default=1)
    memory_mb = models.PositiveIntegerField(
        null=True, blank=True, help_text="host memory (MB), reserved on the node and enforced"
    )
    # Request semantics (docs/jobs.md): whether the job's GPUs may be shared (``never``: GPUs
    # of its own; ``allowed``; ``mps`` / ``time_slicing``; or a MIG profile name such as
    # ``1g.6gb``), filled with the site default (COSCHED_DEFAULT_SHARING) when not given; and
    # where it may run (``gpu``: GPUs only; ``auto``: a GPU job the policy may send to a CPU
    # node; ``cpu``: a CPU-only job), filled from ``gpus`` when not given.
    sharing = models.CharField(max_length=40, default="never")
    device = models.CharField(max_length=8, choices=DEVICE_CHOICES, default="gpu")
    elastic_min_workers = models.PositiveIntegerField(null=True, blank=True)
    elastic_max_workers = models.PositiveIntegerField(null=True, blank=True)
    # Elastic training (issue 17): what finishing sooner is worth (one of the two) and the
    # largest global batch; the autoscaling engine's memory (scheduler.elastic.ElasticState).
    elastic_deadline_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="seconds after the start the job should finish by"
    )
    elastic_value_per_hour = models.FloatField(
        null=True, blank=True, help_text="GPU-hours one hour sooner is worth"
    )
    max_global_batch = models.PositiveIntegerField(null=True, blank=True)
    elastic_state = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    # Per attempt: the node stops the job (SIGTERM, then SIGKILL) when an attempt runs longer;
    # it ends FAILED with the reason "time limit" (scheduler.durations for the forms it takes).
    time_limit_s = models.PositiveIntegerField(null=True, blank=True, help_text="seconds")

    state = models.CharField(
        max_length=16, choices=[(s.value, s.value) for s in JobState], default=JobState.PENDING
    )
    submitted_at = models.DateTimeField(auto_now_add=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    requeue_count = models.PositiveIntegerField(default=0)
    # The job types (scheduler.domain.JobSpec.type_key) this job died of GPU out-of-memory
    # beside on a shared GPU (portal.core.oom): policies do not pair them again.
    oom_with = models.JSONField(default=list, blank=True)
    oom_requeues = models.PositiveIntegerField(default=0)
    waiting_reason = models.TextField(
        blank=True, help_text="why the scheduler left the job queued in its last cycle"
    )

    # Job control (docs/job-control.md). ``held``: its owner holds it; the scheduler does not
    # start it until released. ``user_paused``: a person paused it; no policy resumes it.
    # ``dependencies``: [{"type": "afterok", "job": 812}, ...] on jobs of the same owner.
    held = models.BooleanField(default=False)
    user_paused = models.BooleanField(default=False)
    dependencies = models.JSONField(default=list, blank=True)
    # An array task: ``array_of`` is the array's first task (itself for the first one),
    # ``array_index`` its COSCHED_ARRAY_TASK_ID, ``array_limit`` the most tasks placed at once.
    array_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="array_tasks"
    )
    array_index = models.PositiveIntegerField(null=True, blank=True)
    array_limit = models.PositiveIntegerField(null=True, blank=True)
    # Where the runner writes the job's standard output / error on the node (%j, %a, %u, %%);
    # empty: the work directory's cosched-%j.out (error: into the output file).
    output_path = models.CharField(max_length=1000, blank=True)
    error_path = models.CharField(max_length=1000, blank=True)

    # Idempotent submission: one job per (owner, key); the fingerprint catches key reuse.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    idempotency_fingerprint = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "priority", "submitted_at"], name="job_queue_idx"),
            models.Index(fields=["owner", "state"], name="job_owner_state_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_unique",
            )
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.project_id is None and self.owner_id is not None:
            # teams.Project through the foreign key itself: the teams app builds on these
            # models (it reads Gpu), so this module imports nothing of it.
            project_model = self._meta.get_field("project").related_model
            self.project = project_model.objects.default_for(self.owner)
        super().save(*args, **kwargs)

    @property
    def is_terminal(self) -> bool:
        from portal.core.states import TERMINAL

        return self.state in TERMINAL

    @property
    def end_label(self) -> str:
        """A short why beside a final state ("time limit"), else ""."""
        if self.state == JobState.FAILED and self.failure_reason.startswith(TIME_LIMIT_REASON):
            return TIME_LIMIT_REASON
        return ""

    @property
    def sharing_text(self) -> str:
        """The job's sharing request in plain words, as the scheduler reads it (docs/jobs.md)."""
        if not self.gpus:
            return "— (no GPU)"
        known = self.gpu_memory_mb is not None or (
            self.profile is not None and self.profile.gpu_memory_max_mb is not None
        )
        if self.sharing == "never":
            return "never: whole GPUs of its own, nobody is packed beside it"
        if not known:
            return (
                f"{self.sharing}, but its GPU memory is unknown (no profiled maximum, none "
                "declared): it gets whole GPUs of its own"
            )
        if self.sharing == "allowed":
            return "allowed: the policy may pack it beside other jobs, on its GPU memory"
        if self.sharing in ("mps", "time_slicing"):
            return f"only under {self.sharing.replace('_', '-')}, else whole GPUs"
        return f"only in a MIG instance {self.sharing}, else whole GPUs"

    @property
    def device_text(self) -> str:
        """Where the job may run, in plain words (docs/jobs.md)."""
        if self.device == "auto" and self.gpus:
            return "auto: on GPUs, or on a CPU node where the policy finds it better"
        if not self.gpus:
            return "cpu: a CPU node"
        return "gpu: GPUs only, never a CPU node"

    @property
    def current_placement(self) -> Placement | None:
        return self.placements.filter(active=True).order_by("-id").first()


class JobLogChunk(models.Model):
    """A piece of an attempt's full output, in order (``seq``), as the node's agent streamed
    it; kept ``COSCHED_LOG_RETENTION_DAYS`` after the job ends (``job_logs_prune``)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    attempt = models.PositiveIntegerField()
    seq = models.PositiveBigIntegerField(help_text="byte offset in the node's log file")
    size = models.PositiveIntegerField(help_text="bytes of the node's log file it holds")
    text = models.TextField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "attempt", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "seq"], name="log_chunk_unique")
        ]


class JobEvent(models.Model):
    """The job's timeline: every state transition, plus notes (pause reasons, placements)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.CharField(max_length=100, help_text='"user:alice", "scheduler", "node:gpu-1"')
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state}->{self.to_state} by {self.actor}"


class ElasticChange(models.Model):
    """One worker-count change or straggler replacement of an elastic job, with its reason and
    the scaling efficiency S it was based on (issue 17). ``applied``: the job's ranks were
    regrouped into ``attempt`` (the new group); ``refused``: why it could not be (no idle GPU
    left, the job stopped); neither: proposed, waiting for the job's next safe point."""

    class Kind(models.TextChoices):
        SCALE = "scale", "Scale"
        REPLACE = "replace", "Replace stragglers"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="elastic_changes")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    workers_from = models.PositiveIntegerField()
    workers_to = models.PositiveIntegerField()
    ranks = models.JSONField(default=list, blank=True)
    efficiency = models.FloatField(null=True, blank=True, help_text="scaling efficiency S")
    local_batch = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField()
    policy = models.CharField(max_length=100, blank=True)
    applied = models.BooleanField(default=False)
    attempt = models.PositiveIntegerField(
        null=True, blank=True, help_text="the attempt that runs the new group"
    )
    gpus = models.CharField(max_length=2000, blank=True, help_text="the new group's GPUs")
    refused = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.summary()}"

    def summary(self) -> str:
        """``2 -> 4 workers (S=0.84)`` or ``replace rank(s) 3``."""
        if self.kind == self.Kind.REPLACE:
            return "replace rank(s) " + ", ".join(str(r) for r in self.ranks or [])
        text = f"{self.workers_from} -> {self.workers_to} workers"
        return text + (f" (S={self.efficiency:.2f})" if self.efficiency is not None else "")


class Placement(models.Model):
    """One **attempt** of a job: where and how it runs; ``active`` while it holds its resources.

    ``node`` / ``cpus`` are node rank 0's; ``gpus`` are every GPU of the attempt (all nodes);
    ``parts`` has one row per node (``PlacementPart``), node rank order, with what each node's
    agent reported. ``attempt`` counts a job's attempts from 1."""

    class Outcome(models.TextChoices):
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        REQUEUED = "requeued", "Requeued"
        PREEMPTED = "preempted", "Preempted"
        REGROUPED = "regrouped", "Regrouped (elastic)"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="placements")
    attempt = models.PositiveIntegerField(default=None, help_text="1, 2, ... per job")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="placements")
    gpus = models.ManyToManyField(Gpu, blank=True, related_name="placements")
    sharing_mode = models.CharField(max_length=16, choices=SHARING_MODES, default="exclusive")
    mps_percentage = models.PositiveIntegerField(null=True, blank=True)
    mig_profile = models.CharField(max_length=40, blank=True)
    gpu_memory_mb = models.FloatField(default=0, help_text="memory committed per GPU")
    cpus = models.PositiveIntegerField(default=1)
    policy = models.CharField(max_length=100)
    explanation = models.TextField(blank=True)
    score = models.FloatField(null=True, blank=True)
    active = models.BooleanField(default=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="every part started")
    released_at = models.DateTimeField(null=True, blank=True, help_text="the attempt ended")
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    end_reason = models.TextField(blank=True)
    master_port = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="MASTER_PORT of a multi-process attempt, unique among the active attempts "
        "whose rank 0 is on the same node (portal.core.ports)",
    )
    # Where the attempt's current progress window began (portal.core.observations): at (epoch
    # s), fraction, steps and the co-runner types then; {} before its first progress report.
    progress_mark = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job"], condition=Q(active=True), name="one_active_placement_per_job"
            ),
            models.UniqueConstraint(
                fields=["node", "master_port"],
                condition=Q(active=True, master_port__isnull=False),
                name="one_master_port_per_node",
            ),
            models.UniqueConstraint(fields=["job", "attempt"], name="placement_job_attempt"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} on {self.node_id} ({self.sharing_mode})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Numbered on creation when the writer did not number it (the scheduler does); the
        # unique constraint on (job, attempt) catches two writers racing.
        if self._state.adding and self.attempt is None:
            last = Placement.objects.filter(job_id=self.job_id).aggregate(n=models.Max("attempt"))
            self.attempt = (last["n"] or 0) + 1
        super().save(*args, **kwargs)


class PlacementPart(models.Model):
    """One node's part of an attempt, and what that node's agent said about it.

    ``offered_at``: first sent to the agent as launchable; ``started_at``: the agent reported
    it running; ``reported_at``: the agent reported how it ended (``outcome``, ``exit_code``,
    ``detail``: recorded exactly once); ``settled_at``: known not to run any more (reported,
    absent from the agent's list, or fenced by the node's lease). A job's next attempt is
    launched only when every part of its earlier attempts is settled."""

    placement = models.ForeignKey(Placement, on_delete=models.CASCADE, related_name="parts")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="placement_parts")
    node_rank = models.PositiveIntegerField(default=0)
    gpu_indices = models.JSONField(default=list, blank=True)
    cpus = models.PositiveIntegerField(default=1)
    offered_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    run_state = models.CharField(max_length=16, blank=True, help_text="as the agent reports it")
    outcome = models.CharField(max_length=16, blank=True, help_text="workers.protocol.OUTCOMES")
    exit_code = models.IntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["placement_id", "node_rank"]
        constraints = [
            models.UniqueConstraint(fields=["placement", "node_rank"], name="part_rank_unique")
        ]
        indexes = [models.Index(fields=["node", "settled_at"], name="part_node_settled_idx")]

    def __str__(self) -> str:
        return f"{self.placement} rank {self.node_rank} on {self.node_id}"


class OutboxMessage(models.Model):
    """A message a state change implies, written in the change's transaction and relayed after
    commit (``portal.core.outbox``): ``schedule`` (run a cycle soon) or ``nudge`` (make node
    ``target``'s agent sync now). Delivery is an optimisation: periodic cycles and syncs would
    catch up without it."""

    class Kind(models.TextChoices):
        SCHEDULE = "schedule", "Schedule"
        NUDGE = "nudge", "Nudge"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=100, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    next_try_at = models.DateTimeField(db_index=True)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.target} ({self.reason})"


class MetricSample(models.Model):
    """One time-series point for a GPU, a node, a job or the cluster (all three null)."""

    at = models.DateTimeField()
    metric = models.CharField(max_length=40, help_text="util_pct, memory_used_mb, slowdown, ...")
    value = models.FloatField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="+")

    class Meta:
        ordering = ["at"]
        indexes = [
            models.Index(fields=["gpu", "metric", "at"], name="metric_gpu_idx"),
            models.Index(fields=["job", "metric", "at"], name="metric_job_idx"),
            models.Index(fields=["metric", "at"], name="metric_at_idx"),
        ]


class PolicySettings(models.Model):
    """A named policy configuration; exactly one is active (used by the scheduling loop)."""

    name = models.CharField(max_length=100, unique=True, default="default")
    policy = models.CharField(max_length=100, default="fifo", help_text="registered policy name")
    params = models.JSONField(default=dict, blank=True)
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Written by the scheduling loop (issue 18): the error of this configuration when it last
    # failed at run time (the loop then ran ``last_good_*`` instead), and the last one that ran.
    runtime_error = models.TextField(blank=True, default="")
    runtime_error_at = models.DateTimeField(null=True, blank=True)
    runtime_fallback = models.CharField(
        max_length=200, blank=True, default="", help_text="what the loop ran instead"
    )
    last_good_policy = models.CharField(max_length=100, blank=True, default="")
    last_good_params = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "policy settings"
        constraints = [
            models.UniqueConstraint(
                fields=["active"], condition=Q(active=True), name="one_active_policy"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.policy}"


class TrainingState(models.Model):
    """What a data-parallel attempt reported through the training SDK (``workers.sdk``), and
    the data ratio and worker count it is to use (``slowdown_dr``, ALGORITHMS.md §5).

    ``ratio``: tenths of each mini-batch per GPU index of the attempt's node (integers 0..10
    summing to 10). ``epoch_ended``: the job reported an epoch end the DR manager has not
    answered yet. ``slowdown``: SD_i at that epoch end (None until known)."""

    placement = models.OneToOneField(Placement, on_delete=models.CASCADE, related_name="training")
    ratio = models.JSONField(default=list, blank=True)
    workers = models.PositiveIntegerField(null=True, blank=True)
    epoch = models.PositiveIntegerField(default=0)
    iteration = models.PositiveIntegerField(default=0)
    iterations_total = models.PositiveIntegerField(null=True, blank=True)
    iter_time_s = models.FloatField(null=True, blank=True)
    slowdown = models.FloatField(null=True, blank=True)
    epoch_ended = models.BooleanField(default=False)
    reported_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"training of {self.placement}"


class DataRatioChange(models.Model):
    """One entry of a job's data-ratio history: what changed it, when, and why."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="ratio_changes")
    attempt = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    epoch = models.PositiveIntegerField(default=0)
    old = models.JSONField(default=list, blank=True)
    new = models.JSONField(default=list)
    slowdown = models.FloatField(null=True, blank=True)
    actor = models.CharField(max_length=100, help_text='"policy:slowdown_dr", "start"')
    explanation = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}: {self.old} -> {self.new}"


class JobLogTail(models.Model):
    """The last lines of a job's log (``portal.core.metrics.log_tail_store``), for its page.

    In the database, not in Redis: a job's output may hold secrets, and Redis may be reachable
    from where jobs run (docs/security.md). Only the portal reads this table."""

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="log_tail_row"
    )
    text = models.TextField(blank=True)
    updated_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"log tail of job {self.job_id}"


class GpuReading(models.Model):
    """What one attempt's own processes held of one GPU at one moment: memory (MB) and SM
    utilisation (percent; None where the GPU keeps no per-process samples), as the node agent
    attributed NVML's per-process figures (``workers.gpu.attribution``)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_readings")
    attempt = models.PositiveIntegerField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu_index = models.PositiveIntegerField()
    at = models.DateTimeField()
    memory_mb = models.FloatField(null=True, blank=True)
    util_pct = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["at", "gpu_index"]
        indexes = [models.Index(fields=["job", "attempt", "at"], name="gpu_reading_job_idx")]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "node", "gpu_index", "at"], name="gpu_reading_unique"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}.{self.attempt} GPU {self.gpu_index} at {self.at}"


class JobObservation(models.Model):
    """One ``scheduler.knowledge.Observation`` the portal derived from a job's progress (a
    window of one attempt, or a completion); the fields are the Observation's."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="observations")
    attempt = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=16)
    job_type = models.CharField(max_length=200, db_index=True)
    at = models.DateTimeField()
    window_s = models.FloatField()
    gpu_model = models.CharField(max_length=40, null=True, blank=True)
    gpus = models.PositiveIntegerField(default=1)
    mode = models.CharField(max_length=16, choices=SHARING_MODES, default="exclusive")
    co_runners = models.JSONField(default=list, blank=True)
    progress_from = models.FloatField(default=0.0)
    progress_to = models.FloatField(default=0.0)
    steps = models.FloatField(null=True, blank=True)
    owner = models.CharField(max_length=150, blank=True)
    node = models.CharField(max_length=200, blank=True)
    spread = models.BooleanField(default=False)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job_type", "at"], name="observation_type_idx")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.kind} {self.progress_from:.3f}->{self.progress_to:.3f}"
