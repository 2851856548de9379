"""Response shapes of the REST API's cluster (nodes, GPUs, node operations) and of ``me``.
Importable from ``portal.api.serializers`` as well."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from portal.core.models import Gpu, Node


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "index",
            "uuid",
            "model",
            "architecture",
            "memory_mb",
            "sm_count",
            "sharing_modes",
            "mig_profiles",
            "current_mode",
        ]


class NodeSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)
    state = serializers.SerializerMethodField(
        help_text="as sinfo says it: up, draining (jobs still running), drained, down (lost) "
        "or 'down (staff)'"
    )
    state_changed_by = serializers.CharField(
        read_only=True, allow_null=True, help_text="staff only (null for others)"
    )
    isolation = serializers.JSONField(
        read_only=True,
        help_text="staff only (null for others): how the node keeps jobs apart, as its agent "
        'reported: [{"what": "accounts" | "limits" | "gpu_devices", "level": "ok" | "weak" | '
        '"n/a", "text"}]',
    )
    container_runtimes = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text='container runtimes the node runs container jobs with ("podman", '
        '"apptainer"; docs/containers.md); empty: no container jobs there',
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "kind",
            "cores",
            "memory_mb",
            "backend",
            "status",
            "state",
            "state_reason",
            "state_changed_by",
            "state_changed_at",
            "agent_version",
            "last_heartbeat",
            "gpus",
            "container_runtimes",
            "isolation",
        ]

    def get_state(self, instance: Node) -> str:
        from portal.core.node_ops import node_state_label

        return node_state_label(instance)

    def to_representation(self, instance: Node) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            data["isolation"] = None  # accounts, paths: the operators' business
            data["state_changed_by"] = None
        return data


class NodeOperationSerializer(serializers.Serializer):
    """A drain or down: why (required for both; ignored by resume)."""

    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="why the node is drained or taken down (shown on the cluster page)",
    )


class NodeDownResultSerializer(serializers.Serializer):
    node = NodeSerializer()
    requeued = serializers.ListField(
        child=serializers.IntegerField(), help_text="jobs preempted back to the queue"
    )


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    email = serializers.CharField()
    is_staff = serializers.BooleanField()
    auth = serializers.CharField(help_text="how this request authenticated: token or session")
