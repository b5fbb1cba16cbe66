# One image for every agentops process: web (the admin), worker, beat, flower and the demo deploy target.
# docker-compose.yml starts each with its own command; tests/admin/test_compose.py checks those commands.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGENTOPS_VAR_DIR=/var/lib/agentops

# git: the release agent reads and writes git repositories.
# bubblewrap: the sandbox of every command run for a user (agentops/sandbox.py). Debian's build is not
# setuid: it needs user namespaces, which the container must allow (docker-compose.yml's worker
# services, docs/operators.md "The sandbox in the containers").
RUN apt-get update \
    && apt-get install -y --no-install-recommends git bubblewrap \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml manage.py ./
COPY agentops ./agentops
COPY workflows ./workflows
COPY tasks ./tasks
# Editable, so the code (templates and migrations included) runs from /app as in development.
RUN pip install -e .

RUN useradd --create-home --uid 10001 agentops \
    && mkdir -p /var/lib/agentops \
    && chown agentops /var/lib/agentops
USER agentops

EXPOSE 8000 5555
# The web tier (agentops/gunicorn.py); compose gives every other process its own command.
CMD ["gunicorn", "-c", "python:agentops.gunicorn"]
