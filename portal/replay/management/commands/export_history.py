"""``manage.py export_history --since 2026-11-01 --until 2026-12-01 --out DIR``: the portal's
completed jobs of a period and its nodes as a simulator trace, profiles and cluster spec
(docs/replay.md), ready for ``python -m scheduler.simulate``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from portal.replay.export import history_export, history_export_write


def _instant(text: str, option: str) -> datetime:
    value = parse_datetime(text)
    if value is None:
        day = parse_date(text)
        if day is not None:
            value = datetime(day.year, day.month, day.day)
    if value is None:
        raise CommandError(
            f"{option}: expected a date or date-time such as 2026-11-01T00:00, got {text!r}"
        )
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


class Command(BaseCommand):
    help = "Export completed jobs and the cluster as a simulator trace (docs/replay.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="jobs submitted at or after (UTC)")
        parser.add_argument("--until", help="jobs submitted before (UTC; default: now)")
        parser.add_argument("--out", required=True, help="directory for the three files")

    def handle(self, *args: Any, **opts: Any) -> None:
        since = _instant(opts["since"], "--since")
        until = _instant(opts["until"], "--until") if opts["until"] else timezone.now()
        if since >= until:
            raise CommandError("--until must be after --since")
        export = history_export(since, until)
        paths = history_export_write(export, Path(opts["out"]))
        self.stdout.write(
            f"exported {len(export.jobs)} completed jobs on {len(export.cluster['nodes'])} nodes"
        )
        for reason, n in sorted(export.left_out.items()):
            self.stdout.write(f"left out {n}: {reason}")
        self.stdout.write("wrote " + ", ".join(str(p) for p in paths.values()))
        self.stdout.write(
            "replay: python -m scheduler.simulate "
            f"--trace {paths['trace']} --profiles {paths['profiles']} --cluster {paths['cluster']} "
            "--policy fifo --policy binpack"
        )
