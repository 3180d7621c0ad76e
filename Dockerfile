# WhaleFlux container image: one image for every service and the agent.
#   docker build -t whaleflux .
#   docker run --rm whaleflux                      # prints the CLI help
#   docker run --rm whaleflux whaleflux service telemetry
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Unprivileged runtime user; its home holds WHALEFLUX_HOME.
RUN groupadd --system --gid 10001 whaleflux \
 && useradd --system --uid 10001 --gid whaleflux --create-home --home-dir /home/whaleflux whaleflux

# The source tree stays at /app (the simulated agents read
# /app/shared/data/fleets/*.yaml from it).
WORKDIR /app
COPY pyproject.toml README.md ./
COPY whaleflux/ whaleflux/
COPY shared/ shared/
COPY services/ services/

RUN pip install --no-cache-dir . \
 && rm -rf build ./*.egg-info

ENV WHALEFLUX_HOME=/home/whaleflux/.whaleflux \
    WHALEFLUX_HTTP_HOST=0.0.0.0 \
    WHALEFLUX_HTTP_PORT=8000

USER whaleflux
EXPOSE 8000

CMD ["whaleflux", "--help"]
