# One image for every Cosched service (web, scheduler worker, beat, node agent).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY portal ./portal
COPY scheduler ./scheduler
COPY workers ./workers
COPY templates ./templates
COPY static ./static
COPY manage.py ./
RUN pip install --no-cache-dir . && python manage.py collectstatic --noinput
# The node agent's fallback account: jobs of portal users without an account here run as it,
# never as root (docs/security.md).
RUN useradd --system --no-create-home --shell /usr/sbin/nologin cosched-job
EXPOSE 8000
CMD ["gunicorn", "portal.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
