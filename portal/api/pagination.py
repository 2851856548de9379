"""Page-number pagination with a client-chosen page size (``?page=2&page_size=20``).

A ``page_size`` that is not a whole number from 1 to ``max_page_size`` is a 400 naming it
(DRF would silently fall back to the default: ``page_size=null`` answered 50 rows); a page
past the last one, or not a number, is DRF's 404 ``Invalid page.``."""

from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination


class StandardPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int | None:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError(
                {
                    self.page_size_query_param: [
                        f"must be a whole number from 1 to {self.max_page_size}, got {raw[:40]!r}"
                    ]
                }
            )
        return int(raw)

    def get_page_number(self, request: Any, paginator: Any) -> Any:
        raw = request.query_params.get(self.page_query_param)
        if raw is not None and not raw.strip():  # DRF reads an empty page as page 1
            raise NotFound(self.invalid_page_message.format(page_number=raw, message="empty"))
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.page_size_query_param:
                param["schema"].update(minimum=1, maximum=self.max_page_size)
            elif param["name"] == self.page_query_param:
                param["schema"]["minimum"] = 1
        return params
