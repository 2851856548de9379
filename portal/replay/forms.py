from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.utils import timezone


class ReplayForm(forms.Form):
    """A what-if replay: a period, the policies to compare, the simulator's interference model."""

    since = forms.DateTimeField(
        label="From (UTC)",
        help_text="jobs submitted at or after this instant",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    until = forms.DateTimeField(
        label="Until (UTC)",
        help_text="jobs submitted before this instant",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    policies = forms.MultipleChoiceField(
        label="Policies", widget=forms.CheckboxSelectMultiple, help_text="one simulation each"
    )
    interference = forms.ChoiceField(
        label="Interference model", help_text="how the simulator slows co-located jobs"
    )
    seed = forms.IntegerField(label="Seed", initial=0, min_value=0, max_value=2**31 - 1)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from portal.replay.services import interference_choices, policy_choices

        super().__init__(*args, **kwargs)
        self.fields["policies"].choices = policy_choices()
        self.fields["interference"].choices = [(m, m) for m in interference_choices()]
        if not self.is_bound:
            now = timezone.now().replace(second=0, microsecond=0)
            self.initial.setdefault("since", now - timedelta(days=7))
            self.initial.setdefault("until", now + timedelta(minutes=1))
            self.initial.setdefault("policies", ["fifo", "binpack"])
            self.initial.setdefault("interference", "class_based")
