"""portal.api.serializers after its split (issue 28): every name the API, its plug-ins and the
docs use is still importable from it, and is the one its own module defines."""

from __future__ import annotations

from portal.api import cluster_serializers, fields, profile_serializers, serializers


def test_every_serializer_and_field_is_importable_from_portal_api_serializers():
    for module in (fields, profile_serializers, cluster_serializers):
        public = [
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__ == module.__name__
        ]
        assert public, module.__name__
        for name in public:
            assert getattr(serializers, name) is getattr(module, name), name
            assert name in serializers.__all__ or name.startswith("_"), name
