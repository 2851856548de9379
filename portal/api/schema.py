"""OpenAPI extensions: describe the portal's own token authentication in the schema."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "portal.front.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):  # noqa: ANN001, ANN201
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'Personal API token: "Authorization: Token cos_..." (account page)',
        }


# -- every status each operation answers (issue 29, part 5) ------------------------------------

_METHODS = ("get", "post", "put", "patch", "delete")
NO_NUL = "^[^\\u0000]*$"  # PostgreSQL stores no NUL character: any text holding one is a 400
_ERROR = {"$ref": "#/components/schemas/ErrorDetail"}
_FIELDS = {"$ref": "#/components/schemas/FieldErrors"}
_COMMON = {
    "401": ("no credentials, or a wrong, revoked or expired token", _ERROR),
    "403": ("not allowed to you (a staff-only operation, another user's object)", _ERROR),
    "429": ("too many requests: retry after the Retry-After seconds", _ERROR),
    "503": ("the database connection was lost: retry after the Retry-After seconds", _ERROR),
}


def _response(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _no_nul(schema: dict[str, Any]) -> None:
    """Every free text in ``schema`` (recursively) refuses NUL characters."""
    if not isinstance(schema, dict):
        return
    if (
        schema.get("type") == "string"
        and "enum" not in schema
        and "format" not in schema
        and "pattern" not in schema
    ):
        schema["pattern"] = NO_NUL
    for key in ("properties", "patternProperties"):
        for sub in (schema.get(key) or {}).values():
            _no_nul(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _no_nul(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            _no_nul(sub)


def document_every_status(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: each operation lists every status it can answer
    besides its own (400 for a bad parameter, NUL included; 401/403; 404 for an object or a
    page that does not exist; 413 for a body over the limit; 429; 503 for a lost database
    connection), text parameters and fields say they refuse NUL, and request bodies are
    documented as JSON (the form encodings DRF also reads are not part of the contract; the
    profile import keeps its multipart upload)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorDetail"] = {
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    }
    schemas["FieldErrors"] = {
        "type": "object",
        "description": "one entry per bad field or parameter: its name -> messages",
        "additionalProperties": True,
    }
    for path, item in result.get("paths", {}).items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            params = op.get("parameters", [])
            responses.setdefault("400", _response("a bad parameter or field (named)", _FIELDS))
            for code, (description, schema) in _COMMON.items():
                responses.setdefault(code, _response(description, schema))
            # A page past the last, or a ``format`` no renderer serves (DRF answers 404).
            if "{" in path or any(p.get("name") in ("page", "format") for p in params):
                responses.setdefault("404", _response("no such object, or no such page", _ERROR))
            body = op.get("requestBody")
            if body:
                responses.setdefault(
                    "413", _response("request body over the limit (JSON 413)", _ERROR)
                )
                content = body.get("content", {})
                keep = {"application/json"}
                if op.get("operationId", "").endswith("import_create"):  # a file upload
                    keep.add("multipart/form-data")
                if "application/json" in content:
                    for media in set(content) - keep:
                        del content[media]
            for param in params:
                _no_nul(param.get("schema", {}))
                if param.get("name") == "page" and param.get("schema", {}).get("type") == "integer":
                    param["schema"]["minimum"] = 1
    for name in _request_components(result):
        # the API refuses unknown fields (a 400 naming them): say so
        schemas[name]["additionalProperties"] = False
    for schema in schemas.values():
        _no_nul(schema)
    return result


def _request_components(result: dict[str, Any]) -> set[str]:
    names = set()
    for item in result.get("paths", {}).values():
        for method in _METHODS:
            body = (item.get(method) or {}).get("requestBody") or {}
            for media in body.get("content", {}).values():
                ref = media.get("schema", {}).get("$ref", "")
                if ref.startswith("#/components/schemas/"):
                    names.add(ref.rsplit("/", 1)[1])
    return names
