# The agent-scheduler image: one image, the role is the first argument (coordinator | worker).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY common common
COPY worker worker
COPY coordinator coordinator
COPY scale scale
COPY agent_scheduler agent_scheduler
RUN pip install --no-cache-dir .
USER 65532:65532
ENTRYPOINT ["agent-scheduler"]
