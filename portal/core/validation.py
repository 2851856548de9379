"""Bounds on what a submission may hold, and admission against the registered cluster.

One place for the limits the API, the browser form, the profile import and the CLI's server all
apply (issue 12: every bad input a 400 naming the field, never a 500 from the database):

- integers are bounded to what the model stores (PostgreSQL ``integer``: at most 2^31 - 1) and to
  a sane maximum (``LIMITS``);
- text holds no NUL character (PostgreSQL refuses them) and no lone surrogate (not Unicode);
- JSON objects (``params``, a profile's ``args``) are bounded in nesting depth and size, hold
  only finite numbers and clean text;
- a command is at most ``COMMAND_MAX_BYTES``: the node agent runs it as the single argument of
  ``/bin/sh -c``, and Linux refuses one argument longer than ``MAX_ARG_STRLEN`` (32 pages of
  4 KiB = 128 KiB, with its terminating NUL) with E2BIG at launch.

``admission_errors`` asks ``scheduler.admission.admit`` whether a job can *ever* run on the
registered cluster (issue 10): a job asking more GPUs of one model than exist, more GPU memory
than any GPU, or more cores than any node is refused at submission with the largest request that
would fit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from portal.core import lookups
from scheduler.admission import Admission, admit, capacity_of
from workers.protocol import json_nesting_depth  # noqa: F401  (one scanner, shared)

#: PostgreSQL ``integer`` (Django's IntegerField and PositiveIntegerField).
DB_INT_MAX = 2**31 - 1

#: (minimum, maximum) of each integer job field. Maxima are far above any real cluster and far
#: below what the database stores, so a typo (or an attack) is a 400 naming the field.
LIMITS: dict[str, tuple[int, int]] = {
    "gpus": (0, 4096),
    "cpus": (1, 65536),
    "memory_mb": (1, 64 * 1024 * 1024),  # 64 TiB of host memory
    "gpu_memory_mb": (1, 1024 * 1024),  # 1 TiB per GPU
    "elastic_min_workers": (1, 4096),
    "elastic_max_workers": (1, 4096),
    "priority": (-1000, 1000),
    "elastic_deadline_s": (1, 10 * 365 * 86400),  # ten years, in seconds
    "max_global_batch": (1, 2**24),
}

#: (minimum, maximum) of each number (float) job field.
FLOAT_LIMITS: dict[str, tuple[float, float]] = {
    "elastic_value_per_hour": (0.0, 1e6),
}

#: Linux's limit on one argument of execve (MAX_ARG_STRLEN = 32 * 4 KiB pages), NUL included.
MAX_ARG_STRLEN = 32 * 4096
COMMAND_MAX_BYTES = MAX_ARG_STRLEN - 1
JSON_MAX_DEPTH = 20
JSON_MAX_BYTES = 64 * 1024
TEXT_MAX_CHARS = 100_000


def command_error(command: str) -> str | None:
    """Why ``command`` cannot be launched (None: it can)."""
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > COMMAND_MAX_BYTES:
        return (
            f"the command is {size:,} bytes; at most {COMMAND_MAX_BYTES:,} bytes: the node runs it "
            f"as one argument of /bin/sh -c and Linux limits one argument to "
            f"{MAX_ARG_STRLEN // 1024} KiB (MAX_ARG_STRLEN). Put a long script in a file and run "
            "that file"
        )
    return None


def text_error(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (None: it can)."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which cannot be stored"
    for ch in value:
        if "\ud800" <= ch <= "\udfff":
            return f"contains a lone surrogate (U+{ord(ch):04X}): not valid Unicode text"
    return None


def json_error(
    value: Any, *, max_depth: int = JSON_MAX_DEPTH, max_bytes: int = JSON_MAX_BYTES
) -> str | None:
    """Why ``value`` (already decoded JSON) cannot be stored (None: it can). Iterative, so a
    deeply nested value cannot exhaust the stack here."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, where = stack.pop()
        at = f" at {where}" if where else ""
        if isinstance(item, dict | list):
            if depth > max_depth:
                return f"nested {depth} levels deep{at}; at most {max_depth}"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return f"key {key!r}{at} is not text"
                    problem = text_error(key)
                    if problem:
                        return f"key {key[:40]!r}{at} {problem}"
                    stack.append((child, depth + 1, f"{where}.{key}" if where else key))
            else:
                for i, child in enumerate(item):
                    stack.append((child, depth + 1, f"{where}[{i}]"))
        elif isinstance(item, str):
            problem = text_error(item)
            if problem:
                return f"the value{at} {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"the value{at} is {item}; only finite numbers are allowed"
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**63 - 1:
            return f"the number{at} is too large (at most 2^63 - 1)"
        elif item is not None and not isinstance(item, bool | int | float):
            return f"the value{at} is a {type(item).__name__}, not JSON"
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    if size > max_bytes:
        return f"{size:,} bytes of JSON; at most {max_bytes:,}"
    return None


def job_input_errors(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """Bounds of a submission's fields (integers, text, JSON, command length), per field."""
    errors: dict[str, list[str]] = {}
    for name, (low, high) in LIMITS.items():
        value = data.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, int):
            continue
        if not low <= value <= high:
            errors.setdefault(name, []).append(f"must be between {low:,} and {high:,}")
    for name, (flow, fhigh) in FLOAT_LIMITS.items():
        value = data.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not (math.isfinite(value) and flow <= value <= fhigh):
            errors.setdefault(name, []).append(f"must be a number between {flow:g} and {fhigh:g}")
    for name in ("name", "command", "container_image"):
        value = data.get(name)
        if isinstance(value, str):
            problem = text_error(value)
            if problem:
                errors.setdefault(name, []).append(problem)
    command = data.get("command")
    if isinstance(command, str) and "command" not in errors:
        problem = command_error(command)
        if problem:
            errors.setdefault("command", []).append(problem)
    params = data.get("params")
    if params is not None:
        problem = json_error(params)
        if problem:
            errors.setdefault("params", []).append(problem)
    image = data.get("container_image")
    if isinstance(image, str) and image.strip() and "container_image" not in errors:
        problem = container_image_error(image.strip())
        if problem:
            errors.setdefault("container_image", []).append(problem)
    return errors


def container_image_error(image: str) -> str:
    """Why a container image cannot run here (docs/containers.md), or "": not on the image
    allow-list (``COSCHED_CONTAINER_IMAGES``), or nodes are registered and none has a container
    runtime (with no node at all, the job waits for the first one, as admission says)."""
    from django.conf import settings

    from workers.containers import image_allowed, valid_image

    patterns = list(settings.COSCHED.get("CONTAINER_IMAGES") or ())
    if not valid_image(image):
        return (
            "not an image reference: letters, digits and . _ / : @ + - only, starting with a "
            "letter, a digit or / (such as docker.io/library/python:3.12)"
        )
    if not image_allowed(image, patterns):
        return f"image {image} is not allowed here (allowed: {', '.join(patterns)})"
    if not container_runtime_available():
        return NO_RUNTIME_TEXT
    return ""


NO_RUNTIME_TEXT = (
    "no node here has a container runtime (Podman or Apptainer): give a command to run on "
    "the nodes instead"
)


def container_runtime_available() -> bool:
    """Whether container jobs can run: some registered node has a container runtime, or no
    node is registered yet (jobs then wait for the first)."""
    from portal.core.models import Node

    runtimes = list(Node.objects.values_list("container_runtimes", flat=True))
    return not runtimes or any(runtimes)


def container_image_help() -> str:
    """The submit form's help for the image field: the allow-list, or why none can run."""
    from django.conf import settings

    if not container_runtime_available():
        return "Not available: " + NO_RUNTIME_TEXT + "."
    patterns = list(settings.COSCHED.get("CONTAINER_IMAGES") or ())
    allowed = f" Allowed images: {', '.join(patterns)}." if patterns else ""
    return (
        "Optional: the job runs in this image (as you, with only its GPUs, cores and memory, "
        "its work directory mounted, no network), e.g. nvcr.io/nvidia/pytorch:24.05." + allowed
    )


# -- admission ---------------------------------------------------------------------------------


def registered_nodes() -> list[Any]:
    """Every registered node as an idle ``NodeState`` (up or down alike: admission counts the
    cluster as registered, whatever is busy or down now). One query of plain values, and no
    placement is read: what runs where does not matter here. Read once per
    ``portal.core.lookups.submission_lookups`` block."""
    return lookups.remembered("registered_nodes", _read_registered_nodes)


def _read_registered_nodes() -> list[Any]:
    from types import SimpleNamespace

    from portal.core.adapters import gpu_spec_of
    from portal.core.models import Node
    from scheduler.domain import GpuState, NodeKind, NodeState

    fields = ("model", "architecture", "memory_mb", "sm_count", "sharing_modes", "mig_profiles")
    specs: dict[str, Any] = {}  # equal rows share one spec (a cluster has few GPU kinds)
    nodes: dict[int, tuple[str, str, int, int]] = {}
    by_node: dict[int, list[Any]] = {}
    # One query: each node joined with its GPUs (a node without GPUs comes once, its GPU
    # columns null), by node name and GPU index.
    rows = Node.objects.order_by("name", "gpus__index").values_list(
        "pk", "name", "kind", "cores", "memory_mb", "gpus__index", *(f"gpus__{f}" for f in fields)
    )
    for pk, name, kind, cores, memory_mb, index, *values in rows:
        nodes.setdefault(pk, (name, kind, cores, memory_mb))
        if index is None:
            continue
        key = json.dumps(values, sort_keys=True, default=str)
        if key not in specs:
            specs[key] = gpu_spec_of(SimpleNamespace(**dict(zip(fields, values, strict=True))))
        by_node.setdefault(pk, []).append((index, specs[key]))
    out = []
    for pk, (name, kind, cores, memory_mb) in nodes.items():
        gpus = tuple(GpuState(node=name, index=i, spec=spec) for i, spec in by_node.get(pk, []))
        out.append(
            NodeState(
                name=name,
                kind=NodeKind(kind),
                cores=cores,
                free_cores=cores,
                memory_mb=float(memory_mb),
                gpus=gpus,
            )
        )
    return out


def admission_of(data: Mapping[str, Any], nodes: Iterable[Any] | None = None) -> Admission:
    """``scheduler.admission.admit`` for a submission's (type-checked) fields."""
    from portal.core.adapters import job_to_domain
    from portal.core.models import Job

    fields = {
        "name": data.get("name") or "",
        "kind": data.get("kind") or getattr(data.get("profile"), "kind", None) or "other",
        "gpus": data.get("gpus") or 0,
        "gpu_memory_mb": data.get("gpu_memory_mb"),
        "cpus": data.get("cpus") or 1,
        "memory_mb": data.get("memory_mb"),
        "priority": data.get("priority") or 0,
        "params": data.get("params") or {},
        "elastic_min_workers": data.get("elastic_min_workers"),
        "elastic_max_workers": data.get("elastic_max_workers"),
        "profile": data.get("profile"),
        "sharing": data.get("sharing") or "never",
    }
    spec = job_to_domain(Job(**fields))
    return admit(spec, capacity_of(registered_nodes() if nodes is None else nodes))


def admission_errors(
    data: Mapping[str, Any], *, skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Admission's verdict per field (empty: the job can run on the registered cluster once it
    is free enough). Skipped when a field admission reads already failed its own check."""
    if skip & {"gpus", "gpu_memory_mb", "cpus", "profile", "kind", "memory_mb", "sharing"}:
        return {}
    verdict = admission_of(data)
    return {name: [message] for name, message in verdict.errors.items()}


def admission_note(data: Mapping[str, Any]) -> str:
    """What admission says of a job it accepts without checking: with no node registered, every
    job is admitted and waits for the first node (empty string when nodes exist)."""
    from portal.core.models import Node

    # Within a submission's lookups the checks read the cluster already: no query here.
    if registered_nodes() if lookups.active() else Node.objects.exists():
        return ""
    return admission_of(data, nodes=[]).note
