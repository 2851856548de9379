# One image for every Cosched service (web, scheduler worker, beat, node agent), installed from
# the pinned dependency set (requirements.lock) and with the documentation site built in.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 NO_MKDOCS_2_WARNING=1
WORKDIR /app
COPY pyproject.toml requirements.lock README.md mkdocs.yml ./
COPY portal ./portal
COPY scheduler ./scheduler
COPY workers ./workers
COPY templates ./templates
COPY static ./static
COPY docs ./docs
COPY manage.py ./
# The lock pins every version (what CI tests); mkdocs builds the docs the portal serves at
# /docs/ (generated reference pages first, then --strict: a broken link fails the build).
RUN pip install --no-cache-dir -c requirements.lock . mkdocs mkdocs-material \
    && python manage.py collectstatic --noinput \
    && python -m portal.docs_build docs/reference \
    && mkdocs build --strict -d var/docs-site
# The node agent's fallback account: jobs of portal users without an account here run as it,
# never as root (docs/security.md).
RUN useradd --system --no-create-home --shell /usr/sbin/nologin cosched-job
EXPOSE 8000
CMD ["gunicorn", "portal.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
