# The agent-scheduler image: one image, the role is the first argument (coordinator | worker | status).
#
# Two stages: the first builds a wheel of the product packages and installs it with its runtime dependencies
# (no dev extras) into a virtual environment; the second copies only that environment onto a slim base.
# scale/ (the local cluster, benchmarks, tool builds) and tests/ are never copied, so the development
# commands (cluster, bench, demo) say they are not installed instead of running.
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/agent-scheduler
COPY pyproject.toml README.md LICENSE ./
COPY common common
COPY worker worker
COPY coordinator coordinator
COPY agent_scheduler agent_scheduler
RUN /opt/agent-scheduler/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/agent-scheduler/bin/pip wheel --no-cache-dir --no-deps -w /wheels . \
 && /opt/agent-scheduler/bin/pip install --no-cache-dir /wheels/agent_scheduler-*.whl \
 && /opt/agent-scheduler/bin/agent-scheduler --version

FROM python:3.11-slim
COPY --from=build /opt/agent-scheduler /opt/agent-scheduler
ENV PATH=/opt/agent-scheduler/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The chart runs with a read-only root filesystem as this user (restricted Pod Security level).
USER 65532:65532
ENTRYPOINT ["agent-scheduler"]
CMD ["--help"]
