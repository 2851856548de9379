"""The cluster and profile pages carry the predicted-vs-measured interference panel."""

from __future__ import annotations

import pytest

from tests.portal.ml_helpers import profile, titan_node

pytestmark = pytest.mark.django_db


def test_cluster_page_shows_the_interference_panel(client, alice):
    titan_node()
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert 'data-interference-url="/api/v1/interference/heatmap/"' in html
    assert 'id="plot-interference" data-points="0" data-role="predicted"' in html
    assert 'id="plot-interference-measured"' in html
    assert "/static/js/interference.js" in html
    assert "data-url-interference" not in html  # the class-based heatmap left the page


def test_profile_page_shows_its_row_and_column(client, alice):
    p = profile("resnet", 70.0)
    client.force_login(alice)
    html = client.get(f"/profiles/{p.pk}/").content.decode()
    assert f'data-interference-url="/api/v1/interference/heatmap/?profile={p.pk}"' in html
    assert "Predicted by the active model" in html and "/static/js/interference.js" in html
