"""API permissions: every endpoint needs a logged-in user; some writes need staff."""

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request


class IsStaffOrReadOnly(BasePermission):
    """Any authenticated user may read; only staff may write (profile curation)."""

    message = "only staff can change profiles"

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or bool(user.is_staff)
