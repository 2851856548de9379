"""Plotly figures from simulation frames, and a self-contained HTML report.

The figure builders are pure functions of data frames (one ``policy`` column, the columns of
``SimResult.jobs_frame()`` / ``timeline_frame()`` / ``slowdown_frame()``), shared by the
simulator's report and the portal's pages. The report embeds plotly.js inline: it loads
nothing from a CDN and opens offline.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
import plotly.graph_objects as go  # type: ignore[import-untyped]  # plotly ships no type hints

from scheduler.metrics import summary_notes

MAX_POINTS = 4000  # per line; longer series are thinned (plots only, metrics use all points)


def _time_axis(frames: list[pd.DataFrame], column: str = "t_s") -> tuple[float, str]:
    """(divisor, label): seconds for short runs, hours for long ones."""
    end = max((float(f[column].max()) for f in frames if len(f)), default=0.0)
    return (3600.0, "time (h)") if end > 7200 else (1.0, "time (s)")


def _thin(frame: pd.DataFrame) -> pd.DataFrame:
    if len(frame) <= MAX_POINTS:
        return frame
    idx = np.unique(np.linspace(0, len(frame) - 1, MAX_POINTS).astype(int))
    return frame.iloc[idx]


def _layout(fig: go.Figure, title: str, xlabel: str, ylabel: str) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=xlabel,
        yaxis_title=ylabel,
        template="plotly_white",
        legend_title_text="policy",
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        height=380,
    )
    return fig


def jct_cdf_figure(jobs: pd.DataFrame) -> go.Figure:
    """CDF of job completion time (completed jobs), one line per policy; a policy that left
    admitted jobs unfinished is labelled incomplete (its CDF covers only what finished)."""
    fig = go.Figure()
    done = jobs[jobs["end_reason"] == "completed"]
    admitted = jobs[jobs["end_reason"] != "rejected"].groupby("policy", sort=False).size()
    divisor, label = _time_axis([done], "jct_s")
    for policy, group in done.groupby("policy", sort=False):
        jct = np.sort(group["jct_s"].to_numpy(dtype=float)) / divisor
        frac = np.arange(1, len(jct) + 1) / len(jct)
        pts = _thin(pd.DataFrame({"x": jct, "y": frac}))
        name = str(policy)
        if len(group) < admitted.get(policy, 0):
            name += f" (incomplete: {len(group)} of {admitted[policy]} completed)"
        fig.add_trace(go.Scatter(x=pts["x"], y=pts["y"], mode="lines", name=name))
    return _layout(
        fig, "Job completion time (CDF)", label.replace("time", "JCT"), "fraction of jobs"
    )


def utilisation_figure(timeline: pd.DataFrame, gpu_count: int) -> go.Figure:
    """Fraction of GPUs busy over time (step lines), one per policy."""
    fig = go.Figure()
    divisor, label = _time_axis([timeline])
    for policy, group in timeline.groupby("policy", sort=False):
        pts = _thin(group)
        util = pts["busy_gpus"] / gpu_count if gpu_count else pts["busy_gpus"] * np.nan
        fig.add_trace(
            go.Scatter(
                x=pts["t_s"] / divisor, y=util, mode="lines", line_shape="hv", name=str(policy)
            )
        )
    fig = _layout(fig, "GPU utilisation", label, "busy GPUs (fraction)")
    fig.update_yaxes(range=[0, 1.05])
    return fig


def slowdown_figure(samples: pd.DataFrame) -> go.Figure:
    """Mean Slow-Down of running jobs (solid) and SD_max_diff (dotted) over time."""
    fig = go.Figure()
    divisor, label = _time_axis([samples])
    for policy, group in samples.groupby("policy", sort=False):
        pts = _thin(group)
        fig.add_trace(
            go.Scatter(
                x=pts["t_s"] / divisor,
                y=pts["mean"],
                mode="lines",
                name=f"{policy} mean SD",
                legendgroup=str(policy),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=pts["t_s"] / divisor,
                y=pts["max_diff"],
                mode="lines",
                line={"dash": "dot"},
                name=f"{policy} SD_max_diff",
                legendgroup=str(policy),
            )
        )
    return _layout(fig, "Slow-Down of running jobs (ALGORITHMS §5)", label, "Slow-Down")


def queue_figure(timeline: pd.DataFrame) -> go.Figure:
    """Number of queued jobs over time (step lines), one per policy."""
    fig = go.Figure()
    divisor, label = _time_axis([timeline])
    for policy, group in timeline.groupby("policy", sort=False):
        pts = _thin(group)
        fig.add_trace(
            go.Scatter(
                x=pts["t_s"] / divisor,
                y=pts["queued"],
                mode="lines",
                line_shape="hv",
                name=str(policy),
            )
        )
    return _layout(fig, "Queue length", label, "queued jobs")


def notes_of(summary: pd.DataFrame) -> list[str]:
    """The report's status lines: incomplete runs, rejected jobs, the ranking of complete
    runs (the same lines the command line prints)."""
    return summary_notes(summary)


def _note_class(note: str) -> str:
    if note.startswith("INCOMPLETE"):
        return "incomplete"
    return "ranking" if note.startswith("ranking") else "note"


def write_report(
    path: str | Path,
    *,
    title: str,
    summary: pd.DataFrame,
    jobs: pd.DataFrame,
    timeline: pd.DataFrame,
    samples: pd.DataFrame,
    gpu_count: int,
    notes: str = "",
) -> Path:
    """Write a self-contained ``report.html`` (plotly.js inline, no network) and return it."""
    figures = [
        jct_cdf_figure(jobs),
        utilisation_figure(timeline, gpu_count),
        slowdown_figure(samples),
        queue_figure(timeline),
    ]
    parts = []
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    table = summary.to_html(
        index=False, float_format=lambda v: f"{v:,.3f}", border=0, classes="summary", na_rep=""
    )
    status = "\n".join(
        f'<p class="{_note_class(n)}">{html.escape(n)}</p>' for n in notes_of(summary)
    )
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table.summary {{ border-collapse: collapse; font-size: 0.85em; }}
table.summary th, table.summary td {{ padding: 0.25em 0.6em; border-bottom: 1px solid #ddd;
  text-align: right; }}
table.summary th:first-child, table.summary td:first-child {{ text-align: left; }}
.fig {{ max-width: 1100px; }}
.incomplete {{ color: #a40000; font-weight: bold; }}
.ranking {{ font-weight: bold; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(notes)}</p>
{status}
{table}
{"".join(f'<div class="fig">{p}</div>' for p in parts)}
</body></html>
"""
    out = Path(path)
    out.write_text(doc)
    return out
