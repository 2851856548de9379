"""Generate the docs site's reference pages from the code, so they cannot drift from it.

    python -m portal.docs_build docs/reference

writes ``api.md`` (every REST operation from the OpenAPI schema the portal serves, with its
parameters, request and answers), ``openapi.json`` (that schema) and ``policy-parameters.md``
(each registered policy's documented parameters: type, range, default, help). ``make docs``
runs it before ``mkdocs build --strict``; the generated files are not committed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def openapi_schema() -> dict[str, Any]:
    """The schema ``/api/schema/`` serves."""
    from drf_spectacular.generators import SchemaGenerator

    generator = SchemaGenerator()
    schema = generator.get_schema(request=None, public=True)
    return json.loads(json.dumps(schema, default=str))


def _ref_name(node: dict[str, Any]) -> str:
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[1]
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        return f"list of {_ref_name(node['items'])}"
    return node.get("type", "object")


def _anchor(name: str) -> str:
    return name.lower()


def _content_schema(content: dict[str, Any]) -> str:
    names = []
    for media, body in content.items():
        schema = body.get("schema") or {}
        name = _ref_name(schema)
        link = f"[{name}](#{_anchor(name)})" if "$ref" in schema else f"`{name}`"
        names.append(f"{link} ({media})")
    return ", ".join(names)


def _cell(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def api_markdown(schema: dict[str, Any]) -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the OpenAPI schema the portal serves at `/api/schema/` "
        "([openapi.json](openapi.json) here; the interactive version is `/api/docs/` on your "
        "portal). Every operation needs an API token (`Authorization: Token cos_...`) or a "
        "browser session; errors are JSON (`400`: field -> messages; `404`, `409`, `413`, "
        "`429`: `detail`). See [the API guide](../api.md) for examples.",
        "",
    ]
    for path, item in schema["paths"].items():
        for method in HTTP_METHODS:
            op = item.get(method)
            if op is None:
                continue
            lines += [f"## {method.upper()} `{path}`", ""]
            if op.get("summary"):
                lines += [op["summary"], ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters") or []
            if params:
                lines += [
                    "| parameter | in | type | required | description |",
                    "|---|---|---|---|---|",
                ]
                for p in params:
                    kind = _ref_name(p.get("schema") or {})
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {kind} | "
                        f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description'))} |"
                    )
                lines.append("")
            body = op.get("requestBody")
            if body:
                lines += [f"**Request:** {_content_schema(body.get('content', {}))}", ""]
            answers = []
            for code, response in sorted(op.get("responses", {}).items()):
                what = _content_schema(response.get("content", {})) or "no body"
                desc = _cell(response.get("description"))
                answers.append(f"- `{code}`: {what}" + (f": {desc}" if desc else ""))
            lines += ["**Answers:**", "", *answers, ""]
    lines += ["## Schemas", ""]
    for name, component in sorted(schema.get("components", {}).get("schemas", {}).items()):
        lines += [f"### {name}", ""]
        if component.get("description"):
            lines += [_cell(component["description"]), ""]
        if "enum" in component:
            lines += ["One of: " + ", ".join(f"`{v}`" for v in component["enum"]), ""]
            continue
        props = component.get("properties") or {}
        if not props:
            continue
        required = set(component.get("required") or [])
        lines += ["| field | type | notes |", "|---|---|---|"]
        for field, spec in props.items():
            notes = []
            if field in required and not spec.get("readOnly"):
                notes.append("required")
            if spec.get("readOnly"):
                notes.append("read-only")
            if spec.get("nullable"):
                notes.append("nullable")
            if "minimum" in spec or "maximum" in spec:
                notes.append(f"{spec.get('minimum', '')}..{spec.get('maximum', '')}")
            if spec.get("description"):
                notes.append(_cell(spec["description"]))
            kind = _ref_name(spec) if "$ref" in spec or "type" in spec else "see notes"
            if "allOf" in spec:
                kind = _ref_name(spec["allOf"][0])
            lines.append(f"| `{field}` | {kind} | {'; '.join(notes)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def policy_markdown() -> str:
    from portal.core.policy_settings import policy_parameters
    from scheduler.policies.registry import available_policies

    lines = [
        "# Policy parameters",
        "",
        "Generated from the policies' own defaults and the portal's parameter table "
        "(`portal.core.policy_settings`), the same one the admin's policy form and its "
        "validation use. What each policy does is on [Policies and algorithms](../algorithms.md).",
        "",
    ]
    for name in available_policies():
        lines += [f"## `{name}`", "", "| parameter | type and range | default | what it does |"]
        lines.append("|---|---|---|---|")
        for spec in policy_parameters(name):
            default = json.dumps(spec.default)
            lines.append(
                f"| `{spec.name}` | {_cell(spec.describe())} | `{default}` | {_cell(spec.help)} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "docs/reference")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    out.mkdir(parents=True, exist_ok=True)
    schema = openapi_schema()
    (out / "openapi.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    (out / "api.md").write_text(api_markdown(schema))
    (out / "policy-parameters.md").write_text(policy_markdown())
    print(f"docs_build: wrote {out}/api.md, openapi.json, policy-parameters.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
