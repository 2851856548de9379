"""The documentation site (issue 18, part 5): it builds with ``mkdocs build --strict`` (a broken
link or a page left out of the nav fails), its reference pages come from the code, the portal
serves it at /docs/ (with a clear page when it is not built), README links resolve, and no page
a user sees cites ALGORITHMS.md (a file users do not have)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "portal.docs_build", "docs/reference"],
        cwd=REPO,
        check=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def test_the_site_builds_strictly_with_the_generated_references(built_site):
    for page in (
        "index.html",
        "cli/index.html",
        "api/index.html",
        "deploy/index.html",
        "nodes/index.html",
        "algorithms/index.html",
        "reference/api/index.html",
        "reference/policy-parameters/index.html",
        "seed004/index.html",
        "simulator/index.html",
        "benchmarks/index.html",
    ):
        assert (built_site / page).is_file(), page
    api = (built_site / "reference/api/index.html").read_text()
    assert "/api/v1/jobs/" in api and "waiting_reason" in api
    params = (built_site / "reference/policy-parameters/index.html").read_text()
    assert "placement_rate+exec_plan" in params and "max_jobs_per_gpu" in params


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](nowhere.md)\n")
    (tmp_path / "mkdocs.yml").write_text((REPO / "mkdocs.yml").read_text().split("\nnav:")[0])
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode != 0
    assert "nowhere.md" in done.stderr


@pytest.mark.django_db
def test_the_portal_serves_the_built_site(client, settings, built_site):
    settings.DOCS_SITE_DIR = built_site
    home = client.get("/docs/")
    assert home.status_code == 200 and b"Cosched" in b"".join(home.streaming_content)
    cli_page = client.get("/docs/cli/")
    assert b"Exit codes" in b"".join(cli_page.streaming_content)
    assert client.get("/docs/cli").status_code == 302
    assert client.get("/docs/no-such-page/").status_code == 404


@pytest.mark.django_db
def test_without_a_built_site_the_page_says_how_to_build_it(client, settings, tmp_path):
    settings.DOCS_SITE_DIR = tmp_path / "nothing-here"
    response = client.get("/docs/")
    assert response.status_code == 503
    assert "make docs" in response.content.decode()


@pytest.mark.django_db
def test_every_page_links_the_docs_site(client, alice):
    client.force_login(alice)
    html = client.get("/jobs/").content.decode()
    assert '<a href="/docs/">Docs</a>' in html


def test_readme_links_resolve():
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)|`(docs/[\w./-]+\.md)`", readme)
    paths = {a or b for a, b in links if not (a or b).startswith("http")}
    assert paths, "README links no documentation file"
    missing = sorted(p for p in paths if not (REPO / p).is_file())
    assert not missing, missing


def test_no_user_facing_text_cites_algorithms_md():
    offenders = []
    for folder in ("templates", "portal/core/templates", "static/js", "docs"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in {".html", ".js", ".md"}:
                if "reference" in path.parts or path.name in {"simulator.md", "benchmarks.md"}:
                    continue  # generated, or owned by the simulator's and benchmarks' authors
                if "ALGORITHMS.md" in path.read_text(errors="replace"):
                    offenders.append(str(path.relative_to(REPO)))
    assert not offenders
