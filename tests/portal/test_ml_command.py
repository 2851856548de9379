"""``manage.py train_interference``."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from portal.ml.models import TrainedModel, TrainingRun
from scheduler.learning.predictor import load

pytestmark = pytest.mark.django_db


def test_train_activate_and_export(tmp_path):
    out = io.StringIO()
    path = tmp_path / "linear.model"
    call_command(
        "train_interference",
        "--algorithm",
        "linear",
        "--validation",
        "cv5",
        "--no-live",
        "--activate",
        "linear",
        "--export",
        str(path),
        "--quiet",
        stdout=out,
    )
    text = out.getvalue()
    model = TrainedModel.objects.get()
    assert model.active and model.algorithm == "linear" and model.live_samples == 0
    assert TrainingRun.objects.get().source == "command"
    assert "linear regression     cv5" in text and "forest 0.0222 / 0.8758" in text
    assert f"activated {model.name}" in text
    assert load(str(path)).name == model.name


def test_bad_options_are_command_errors():
    with pytest.raises(CommandError, match="not among the trained algorithms"):
        call_command("train_interference", "--algorithm", "linear", "--activate", "forest")
    with pytest.raises(CommandError, match="give --activate too"):
        call_command("train_interference", "--export", "x.model")
    assert not TrainingRun.objects.exists()
