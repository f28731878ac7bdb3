# loopstop sidecar. Build: docker build -t loopstop .
# Run (tokens are required to listen beyond loopback, as inside a container):
#   docker run -p 8765:8765 -v loopstop-data:/data \
#     -v $PWD/loopstop.yaml:/etc/loopstop/loopstop.yaml:ro \
#     -e LOOPSTOP_TOKEN_N8N=... -e LOOPSTOP_TOKEN_ADMIN=... loopstop
# Redis instead of SQLite: -e LOOPSTOP_STORE=redis://redis:6379/0 -e LOOPSTOP_SECRET=...
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    LOOPSTOP_STORE=sqlite:////data/loopstop.db \
    LOOPSTOP_CONFIG=/etc/loopstop/loopstop.yaml \
    LOOPSTOP_BIND=0.0.0.0:8765

WORKDIR /app
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN pip install . \
 && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin loopstop \
 && mkdir -p /data /etc/loopstop \
 && chown loopstop:loopstop /data

USER 10001:10001
VOLUME ["/data"]
EXPOSE 8765

HEALTHCHECK --interval=15s --timeout=4s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/healthz', timeout=3)"]

ENTRYPOINT ["loopstop"]
CMD ["serve", "--workers", "4"]
