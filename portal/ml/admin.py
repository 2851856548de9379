"""Admin of the interference models: train (with progress), compare, activate; live samples.

Writes go through ``portal.ml.services``. A trained model is read-only: its scores describe the
bytes stored with it.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from portal.ml import services
from portal.ml.models import CoRunSample, TrainedModel, TrainingRun
from scheduler.learning.training import ALGORITHM_LABELS, ALGORITHMS, VALIDATIONS

DASH = "—"
COMPARE_METRICS = ("n", "mse", "r2", "mae", "slowdown_mse", "slowdown_r2")


def _fmt(value: Any) -> str:
    if value is None:
        return DASH
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


class TrainForm(forms.Form):
    algorithms = forms.MultipleChoiceField(
        choices=[(a, ALGORITHM_LABELS[a]) for a in ALGORITHMS],
        initial=list(ALGORITHMS),
        widget=forms.CheckboxSelectMultiple,
    )
    validations = forms.MultipleChoiceField(
        choices=[
            ("cv5", "5-fold cross-validation (the thesis' protocol)"),
            ("cv5_pairs", "5-fold with whole pairs held out"),
            ("loao", "leave-one-application-out (slowest)"),
        ],
        initial=list(VALIDATIONS),
        widget=forms.CheckboxSelectMultiple,
    )
    include_live = forms.BooleanField(
        required=False, initial=True, help_text="add the live co-run samples to the Gavel data"
    )
    seed = forms.IntegerField(initial=0)


@admin.register(TrainedModel)
class TrainedModelAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "algorithm",
        "active",
        "cv5_mse",
        "cv5_r2",
        "pairs_mse",
        "loao_mse",
        "loao_r2",
        "live_samples",
        "short_hash",
        "created_at",
    ]
    list_filter = ["active", "algorithm"]
    search_fields = ["name", "dataset_hash"]
    actions = ["activate", "deactivate", "compare"]
    exclude = ["artifact"]
    readonly_fields = [
        "name",
        "algorithm",
        "active",
        "dataset_hash",
        "dataset",
        "features",
        "scores_table",
        "feasibility_scores",
        "live_samples",
        "artifact_sha256",
        "run",
        "created_at",
        "activated_at",
        "activated_by",
    ]
    fields = readonly_fields
    change_list_template = "admin/ml/trainedmodel/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[TrainedModel]:
        return super().get_queryset(request).defer("artifact")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _score(self, obj: TrainedModel, validation: str, metric: str) -> str:
        return _fmt(obj.score(validation, metric))

    @admin.display(description="cv5 MSE")
    def cv5_mse(self, obj: TrainedModel) -> str:
        return self._score(obj, "cv5", "mse")

    @admin.display(description="cv5 R²")
    def cv5_r2(self, obj: TrainedModel) -> str:
        return self._score(obj, "cv5", "r2")

    @admin.display(description="pairs-out MSE")
    def pairs_mse(self, obj: TrainedModel) -> str:
        return self._score(obj, "cv5_pairs", "mse")

    @admin.display(description="LOAO MSE")
    def loao_mse(self, obj: TrainedModel) -> str:
        return self._score(obj, "loao", "mse")

    @admin.display(description="LOAO R²")
    def loao_r2(self, obj: TrainedModel) -> str:
        return self._score(obj, "loao", "r2")

    @admin.display(description="data set")
    def short_hash(self, obj: TrainedModel) -> str:
        return obj.dataset_hash[:12]

    @admin.display(description="scores")
    def scores_table(self, obj: TrainedModel) -> str:
        rows = format_html_join(
            "",
            "<tr><td>{}</td>" + "<td>{}</td>" * len(COMPARE_METRICS) + "</tr>",
            (
                (validation, *(_fmt(s.get(m)) for m in COMPARE_METRICS))
                for validation, s in (obj.scores or {}).items()
            ),
        )
        head = format_html_join("", "<th>{}</th>", ((m,) for m in COMPARE_METRICS))
        return format_html(
            "<table><thead><tr><th>validation</th>{}</tr></thead><tbody>{}</tbody></table>",
            head,
            rows,
        )

    @admin.action(description="Activate the selected model (coscheml uses it)")
    def activate(self, request: HttpRequest, queryset: QuerySet[TrainedModel]) -> None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one model to activate.", messages.ERROR)
            return
        model = services.model_activate(queryset.get(), user=request.user)
        self.message_user(
            request,
            f"Activated {model.name}: the coscheml policy uses it from its next cycle.",
            messages.SUCCESS,
        )

    @admin.action(description="Deactivate (coscheml falls back to its built-in model)")
    def deactivate(self, request: HttpRequest, queryset: QuerySet[TrainedModel]) -> None:
        for model in queryset:
            services.model_deactivate(model)
        self.message_user(request, f"Deactivated {queryset.count()} model(s).", messages.SUCCESS)

    @admin.action(description="Compare the selected models' scores")
    def compare(self, request: HttpRequest, queryset: QuerySet[TrainedModel]) -> HttpResponse:
        models = list(queryset.order_by("-created_at"))
        validations = sorted({v for m in models for v in (m.scores or {})})
        rows = []
        for validation in validations:
            for metric in COMPARE_METRICS:
                values = [(m.scores or {}).get(validation, {}).get(metric) for m in models]
                numbers = [v for v in values if isinstance(v, int | float)]
                best = None
                if metric != "n" and numbers:
                    best = max(numbers) if metric.endswith("r2") else min(numbers)
                rows.append(
                    {
                        "validation": validation,
                        "metric": metric,
                        "cells": [{"text": _fmt(v), "best": v == best} for v in values],
                    }
                )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Compare interference models",
            "models": models,
            "rows": rows,
        }
        return TemplateResponse(request, "admin/ml/trainedmodel/compare.html", context)

    def get_urls(self) -> list[Any]:
        custom = [
            path(
                "train/", self.admin_site.admin_view(self.train_view), name="ml_trainedmodel_train"
            )
        ]
        return custom + super().get_urls()

    def train_view(self, request: HttpRequest) -> HttpResponse:
        """Queue a training run; its progress shows on the training runs page."""
        if not request.user.is_staff:
            return HttpResponseRedirect(reverse("admin:index"))
        if request.method == "POST":
            form = TrainForm(request.POST)
            if form.is_valid():
                data = form.cleaned_data
                run = services.training_run_create(
                    algorithms=data["algorithms"],
                    validations=data["validations"],
                    include_live=data["include_live"],
                    seed=data["seed"],
                    user=request.user,
                )
                services.training_run_start(run)
                self.message_user(
                    request,
                    f"Training run #{run.pk} queued ({', '.join(run.algorithms)}); "
                    "its progress shows below.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:ml_trainingrun_changelist"))
        else:
            form = TrainForm()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Train interference models",
            "form": form,
            "live_samples": CoRunSample.objects.count(),
        }
        return TemplateResponse(request, "admin/ml/trainedmodel/train.html", context)


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "status",
        "source",
        "progress",
        "algorithms",
        "include_live",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "source"]
    readonly_fields = [
        "status",
        "source",
        "progress",
        "algorithms",
        "validations",
        "include_live",
        "seed",
        "message",
        "error",
        "requested_by",
        "created_at",
        "started_at",
        "finished_at",
        "proposed_models",
    ]
    fields = readonly_fields
    change_list_template = "admin/ml/trainingrun/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="progress")
    def progress(self, obj: TrainingRun) -> str:
        return format_html(
            '<progress value="{}" max="100" class="training-progress"></progress> {}% '
            '<span class="help">{}/{} fits · {}</span>',
            obj.percent,
            obj.percent,
            obj.progress_done,
            obj.progress_total or "?",
            obj.message or obj.get_status_display(),
        )

    @admin.display(description="proposed models")
    def proposed_models(self, obj: TrainingRun) -> str:
        names = [m.name for m in obj.models.defer("artifact").all()]
        return ", ".join(names) or DASH

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        busy = TrainingRun.objects.filter(
            status__in=[TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING]
        ).exists()
        return super().changelist_view(request, {**(extra_context or {}), "refresh": busy})


@admin.register(CoRunSample)
class CoRunSampleAdmin(admin.ModelAdmin):
    list_display = [
        "job_a",
        "job_b",
        "profile_a",
        "profile_b",
        "gpu_model",
        "sharing_mode",
        "slowdown",
        "samples",
        "updated_at",
    ]
    list_filter = ["gpu_model", "sharing_mode"]
    readonly_fields = [f.name for f in CoRunSample._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
