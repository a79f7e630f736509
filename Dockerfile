FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY failslow failslow
COPY schema schema
COPY simulator simulator
COPY collectors collectors
COPY models models
COPY streams streams
COPY storage storage
COPY alerting alerting
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT []
