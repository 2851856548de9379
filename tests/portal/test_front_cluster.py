"""The cluster page: registered nodes and GPUs, the GPU backend named as what it is."""

from __future__ import annotations

import pytest

from portal.core.models import Gpu, Node

pytestmark = pytest.mark.django_db


def test_lists_nodes_and_their_gpus(client, alice):
    node = Node.objects.create(name="gpu-1", kind="gpu", cores=32, memory_mb=131072)
    Gpu.objects.create(
        node=node,
        index=0,
        model="A30",
        architecture="Ampere",
        memory_mb=24576,
        sm_count=56,
        sharing_modes=["exclusive", "mps", "mig"],
        mig_profiles=[{"name": "1g.6gb", "slices": 1, "memory_mb": 6144}],
    )
    Node.objects.create(name="cpu-1", kind="cpu", cores=64, status="down")
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert "gpu-1" in html and "cpu-1" in html
    assert "A30" in html and "Ampere" in html and "24.0 GB" in html
    assert ">MPS<" in html and ">1g.6gb<" in html
    assert "GPU backend: virtual" in html
    assert "Down" in html
    assert "No GPUs: CPU jobs run here." in html


def test_an_empty_cluster_says_how_nodes_appear(client, alice):
    client.force_login(alice)
    assert "No nodes registered" in client.get("/cluster/").content.decode()
