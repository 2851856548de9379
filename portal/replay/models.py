"""What-if replays (docs/replay.md): a period of the portal's finished jobs, exported as a
simulator trace and cluster spec, replayed under chosen policies in a background task."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ReplayRun(models.Model):
    """One replay: what was asked, how far it got, and what it found.

    ``summary``: one row per policy (``scheduler.metrics.SUMMARY_COLUMNS`` plus
    ``user_fairness``), and a first row ``live (as it ran)`` computed from the jobs' own times;
    ``per_user``: one row per policy and user (``scheduler.group_metrics.GROUP_COLUMNS``);
    ``left_out``: reason -> number of jobs of the period not exported; ``out_dir``: where the
    export (trace.csv, profiles.yaml, cluster.yaml) and the simulator's summary.csv, jobs.csv
    and report.html were written."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    since = models.DateTimeField(help_text="jobs submitted at or after this instant")
    until = models.DateTimeField(help_text="jobs submitted before this instant")
    policies = models.JSONField(default=list)
    interference = models.CharField(max_length=40, default="class_based")
    seed = models.IntegerField(default=0)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0, help_text="0..1")
    message = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    jobs_exported = models.PositiveIntegerField(default=0)
    left_out = models.JSONField(default=dict, blank=True)
    cluster = models.CharField(max_length=300, blank=True, help_text="the cluster, in words")
    summary = models.JSONField(default=list, blank=True)
    per_user = models.JSONField(default=list, blank=True)
    per_project = models.JSONField(default=list, blank=True)  # the same per project (team)
    out_dir = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"replay {self.pk}: {', '.join(self.policies)} ({self.status})"
