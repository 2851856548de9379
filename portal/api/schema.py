"""OpenAPI extensions: describe the portal's own token authentication in the schema."""

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
