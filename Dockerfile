# scalebook: API, CLI and dashboard in one image (see docker-compose.yml).
#
#   docker build -t scalebook:local .
#   docker run --rm -e SCALEBOOK_DATABASE_URL=postgresql://user:pass@host:5432/scalebook \
#       -p 127.0.0.1:8000:8000 scalebook:local
#
# The default command serves the API on 0.0.0.0:8000, which `scalebook serve` refuses unless an API
# token exists in the database (`scalebook token create --scope admin --direct`) or --insecure is
# given. Migrations are not run implicitly on PostgreSQL: run `scalebook db upgrade` first (the
# compose file does).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SCALEBOOK_DATA_DIR=/data

WORKDIR /app

# Dependencies first (cached while only the code changes): install the pinned requirements from
# pyproject.toml with a stub package, then the real tree on top.
COPY pyproject.toml README.md ./
RUN mkdir -p core service ingest dashboard migrations \
    && touch core/__init__.py service/__init__.py ingest/__init__.py dashboard/__init__.py migrations/__init__.py \
    && pip install . \
    && pip uninstall -y scalebook \
    && rm -rf core service ingest dashboard migrations build *.egg-info

COPY core ./core
COPY service ./service
COPY ingest ./ingest
COPY dashboard ./dashboard
COPY migrations ./migrations
COPY bench ./bench
COPY examples ./examples
# editable: migrations/, dashboard/app.py and examples/data are used from /app
RUN pip install --no-deps -e . \
    && useradd --create-home --uid 10001 scalebook \
    && mkdir -p /data && chown scalebook /data

USER scalebook
EXPOSE 8000 8501
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/v1/health', timeout=4)" || exit 1

CMD ["scalebook", "serve", "--host", "0.0.0.0", "--port", "8000"]
