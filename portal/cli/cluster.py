"""The ``cosched`` commands about the cluster and its accounts: profile runs (staff), nodes
(list, drain / down / resume), projects and usage."""

from __future__ import annotations

import argparse
import urllib.parse
from typing import IO, Any

from portal.cli.client import EXIT_BAD_INPUT, EXIT_OK, Client, CliError
from portal.cli.output import _emit_json, _table, _when


def cmd_profile(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Staff: short solo (and pair) runs of an application, measured into a draft profile."""
    body: dict[str, Any] = {
        "profile": args.app,
        "models": [m.strip() for m in args.models.split(",") if m.strip()],
    }
    if args.with_app:
        body["with_profile"] = args.with_app
    if args.command:
        body["command"] = args.command
    if args.scale is not None:
        body["scale"] = args.scale
    _, answer = client.request("POST", "/api/v1/profiling/", body=body)
    if args.json:
        _emit_json(answer, out)
        return EXIT_OK
    out.write(f"Profiling run {answer['run']}: {len(answer['jobs'])} jobs\n")
    for job in answer["jobs"]:
        out.write(f"  #{job['id']} {job['name']} ({job['state']})\n")
    out.write(
        "Their measurements go into the profile's measured draft (staff review it on the "
        "profile page; GET /api/v1/profiling/?profile=NAME shows it).\n"
    )
    return EXIT_OK


def _node_operation(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    """``cosched nodes drain|down|resume NAME [--reason R]`` (staff), like ``scontrol update
    nodename=NAME state=drain reason=R``."""
    if not args.node:
        raise CliError(f"name the node: cosched nodes {args.action} NAME", EXIT_BAD_INPUT)
    if args.action in ("drain", "down") and not (args.reason or "").strip():
        raise CliError(
            f"say why: cosched nodes {args.action} {args.node} --reason 'replacing a fan'",
            EXIT_BAD_INPUT,
        )
    body = {"reason": args.reason} if args.reason else {}
    path = f"/api/v1/nodes/{urllib.parse.quote(args.node, safe='')}/{args.action}/"
    _, data = client.request("POST", path, body=body, not_found=f"no node {args.node!r}")
    if args.json:
        _emit_json(data, out)
        return EXIT_OK
    node = data.get("node", data) if isinstance(data, dict) else {}
    state = node.get("state") or node.get("status", "")
    if args.action == "down":
        requeued = data.get("requeued") or []
        jobs = ", ".join(str(j) for j in requeued) or "none"
        out.write(f"Node {args.node}: {state}; jobs requeued: {jobs}\n")
    elif args.action == "drain":
        out.write(f"Node {args.node}: {state} (running jobs finish, no new ones start)\n")
    else:
        out.write(f"Node {args.node}: {state}\n")


def cmd_nodes(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """The cluster's nodes, as ``sinfo`` lists a Slurm partition; staff also see how each node
    keeps its jobs apart (``NodeInfo.isolation``). ``drain``, ``down`` and ``resume`` change
    one node (staff)."""
    if getattr(args, "action", "list") != "list":
        return _node_operation(client, args, out)
    nodes: list[dict[str, Any]] = []
    page = 1
    while True:
        _, data = client.request("GET", "/api/v1/nodes/", params={"page_size": 500, "page": page})
        nodes.extend(data.get("results", []) if isinstance(data, dict) else data)
        if not isinstance(data, dict) or not data.get("next"):
            break
        page += 1
    if args.json:
        _emit_json(nodes, out)
        return EXIT_OK
    if not nodes:
        out.write("No nodes: a node appears when its agent first syncs (docs/nodes.md).\n")
        return EXIT_OK
    staff = any(node.get("isolation") is not None for node in nodes)
    headers = ["NODE", "STATUS", "KIND", "GPUS", "CORES", "MEMORY", "CONTAINERS", "HEARTBEAT"]
    rows = []
    for node in nodes:
        models: dict[str, int] = {}
        for gpu in node.get("gpus") or []:
            models[gpu.get("model", "?")] = models.get(gpu.get("model", "?"), 0) + 1
        gpus = ", ".join(f"{n} {m}" for m, n in models.items()) or "-"
        memory = node.get("memory_mb") or 0
        row = [
            node.get("name", ""),
            node.get("state") or node.get("status", ""),
            node.get("kind", ""),
            gpus,
            node.get("cores", ""),
            f"{memory / 1024:.0f} GB" if memory else "-",
            ",".join(node.get("container_runtimes") or ()) or "-",
            _when(node["last_heartbeat"])[:16] if node.get("last_heartbeat") else "never",
        ]
        if staff:
            row.append(_isolation_text(node.get("isolation")))
        rows.append(row)
    extra = ["ISOLATION"] if staff else []
    if any(node.get("state_reason") for node in nodes):  # drained or down by staff: say why
        extra.append("REASON")
        for row, node in zip(rows, nodes, strict=True):
            row.append(node.get("state_reason") or "")
    out.write(_table(rows, headers + extra) + "\n")
    return EXIT_OK


def _isolation_text(aspects: Any) -> str:
    """``ok``, ``weak: accounts, limits`` or ``not reported`` (an agent that does not say)."""
    from workers.protocol import ISOLATION_ASPECTS as labels

    if not aspects:
        return "not reported"
    weak = [labels.get(a.get("what"), a.get("what")) for a in aspects if a.get("level") == "weak"]
    return "weak: " + ", ".join(weak) if weak else "ok"


def cmd_projects(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    _, rows = client.request("GET", "/api/v1/projects/")
    if args.json:
        _emit_json(rows, out)
        return EXIT_OK
    if not rows:
        out.write("No projects yet: your first job creates your personal project.\n")
        return EXIT_OK
    table = []
    for row in rows:
        quotas = ", ".join(
            f"{q['gpu_model']} {q['in_use_gpus']}/{q['guaranteed_gpus']}"
            f"+{'any' if q['borrow_limit_gpus'] is None else q['borrow_limit_gpus']}"
            for q in row.get("quotas", [])
        )
        table.append(
            [
                row["project"] + (" *" if row.get("is_default") else ""),
                row["role"],
                quotas or "-",
                f"{row['my_usage_gpu_hours']:.2f}",
                f"{row['factor']:.3f}",
            ]
        )
    headers = ["PROJECT", "ROLE", "QUOTAS (IN USE/GUARANTEED+BORROW)", "MY GPU-H", "FAIR SHARE"]
    out.write(_table(table, headers) + "\n")
    out.write("* your default project; GPU-hours decayed by the fair-share half-life\n")
    return EXIT_OK


def cmd_usage(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    params: dict[str, Any] = {"since": args.since, "by": args.by}
    if args.until:
        params["until"] = args.until
    try:
        _, data = client.request("GET", "/api/v1/usage/", params=params)
    except CliError as exc:  # a 400 names the bad options, not a job
        raise CliError(
            str(exc).replace("rejected the job:", "rejected the options:"), exc.exit_code
        ) from None
    if args.json:
        _emit_json(data, out)
        return EXIT_OK
    rows = data.get("rows", [])
    if args.csv:
        import csv

        models = sorted({m for row in rows for m in row.get("gpu_seconds_by_model", {})})
        writer = csv.writer(out, lineterminator="\n")
        columns = ["jobs", "gpu_seconds", "cpu_seconds", "wait_seconds", "mean_wait_seconds"]
        writer.writerow([args.by, *columns, *(f"gpu_seconds_{m}" for m in models)])
        for row in rows:
            writer.writerow(
                [
                    row["group"],
                    *(round(row[c], 3) for c in columns),
                    *(round(row["gpu_seconds_by_model"].get(m, 0.0), 3) for m in models),
                ]
            )
        return EXIT_OK
    out.write(f"Usage {_when(data.get('since'))[:16]} to {_when(data.get('until'))[:16]} UTC\n")
    if not rows:
        out.write("No jobs in this window.\n")
        return EXIT_OK
    models = sorted({m for row in rows for m in row.get("gpu_seconds_by_model", {})})
    headers = [args.by.upper(), "JOBS", "GPU-H", *(f"{m}-H" for m in models), "CPU-H", "WAIT-H"]
    table = [
        [
            row["group"],
            row["jobs"],
            f"{row['gpu_seconds'] / 3600:.2f}",
            *(f"{row['gpu_seconds_by_model'].get(m, 0.0) / 3600:.2f}" for m in models),
            f"{row['cpu_seconds'] / 3600:.2f}",
            f"{row['wait_seconds'] / 3600:.2f}",
        ]
        for row in rows
    ]
    total = data.get("total", {})
    table.append(
        [
            "TOTAL",
            total.get("jobs", 0),
            f"{total.get('gpu_seconds', 0.0) / 3600:.2f}",
            *(f"{total.get('gpu_seconds_by_model', {}).get(m, 0.0) / 3600:.2f}" for m in models),
            f"{total.get('cpu_seconds', 0.0) / 3600:.2f}",
            f"{total.get('wait_seconds', 0.0) / 3600:.2f}",
        ]
    )
    out.write(_table(table, headers) + "\n")
    return EXIT_OK
