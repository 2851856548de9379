"""Trained interference models (Co-scheML, ALGORITHMS.md §2), their training runs, and the live
co-run samples they learn from.

A ``TrainedModel`` stores the serialised predictor (``scheduler.learning.predictor.dumps``)
with its data set hash, features, scores and creation time; exactly one may be active, and the
scheduler's ``coscheml`` policy uses it (``portal.ml.apps`` registers the loader).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class TrainingRun(models.Model):
    """One training request (command, admin button, periodic retrain) and its progress."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    class Source(models.TextChoices):
        COMMAND = "command", "manage.py train_interference"
        ADMIN = "admin", "Admin"
        RETRAIN = "retrain", "Periodic retrain"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.ADMIN)
    algorithms = models.JSONField(default=list, help_text='e.g. ["linear", "forest"]')
    validations = models.JSONField(default=list, help_text="cv5, cv5_pairs, loao")
    include_live = models.BooleanField(
        default=True, help_text="add the live co-run samples to the Gavel measurements"
    )
    seed = models.IntegerField(default=0)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    message = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"training run #{self.pk} ({self.status})"

    @property
    def percent(self) -> int:
        if not self.progress_total:
            return 100 if self.status == self.Status.DONE else 0
        return min(100, round(100 * self.progress_done / self.progress_total))


class TrainedModel(models.Model):
    """A fitted interference model with everything needed to judge and load it."""

    name = models.CharField(max_length=100, unique=True)
    algorithm = models.CharField(max_length=32)
    active = models.BooleanField(default=False)
    dataset_hash = models.CharField(max_length=64, help_text="SHA-256 of the training samples")
    dataset = models.JSONField(default=dict, blank=True, help_text="sample counts by family")
    features = models.JSONField(default=list, blank=True, help_text="per-job features used")
    scores = models.JSONField(
        default=dict, blank=True, help_text="validation -> {mse, r2, mae, ...}"
    )
    feasibility_scores = models.JSONField(default=dict, blank=True)
    live_samples = models.PositiveIntegerField(
        default=0, help_text="live co-run samples in its training set"
    )
    artifact = models.BinaryField(help_text="scheduler.learning.predictor.dumps()")
    artifact_sha256 = models.CharField(max_length=64)
    run = models.ForeignKey(
        TrainingRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="models"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    activated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["active"], condition=Q(active=True), name="one_active_interference_model"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name}{' (active)' if self.active else ''}"

    def score(self, validation: str, metric: str) -> float | None:
        value = (self.scores or {}).get(validation, {}).get(metric)
        return None if value is None else float(value)


class CoRunSample(models.Model):
    """Job a's measured slowdown while sharing a GPU with job b only (from the agents' live
    Slow-Down reports): one training sample for the interference model."""

    job_a = models.ForeignKey("core.Job", on_delete=models.CASCADE, related_name="+")
    job_b = models.ForeignKey("core.Job", on_delete=models.CASCADE, related_name="+")
    profile_a = models.ForeignKey(
        "core.ApplicationProfile", on_delete=models.CASCADE, related_name="+"
    )
    profile_b = models.ForeignKey(
        "core.ApplicationProfile", on_delete=models.CASCADE, related_name="+"
    )
    gpu_model = models.CharField(max_length=40)
    sharing_mode = models.CharField(max_length=16)
    slowdown = models.FloatField(help_text="median live Slow-Down of job a while paired")
    norm = models.FloatField(help_text="1 / slowdown: normalised throughput")
    samples = models.PositiveIntegerField(help_text="Slow-Down reports used")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["job_a", "job_b"], name="corun_sample_pair_unique")
        ]
        indexes = [models.Index(fields=["profile_a", "profile_b"], name="corun_profiles_idx")]

    def __str__(self) -> str:
        return f"job {self.job_a_id} next to job {self.job_b_id}: {self.slowdown:.2f}"
