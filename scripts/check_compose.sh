#!/usr/bin/env bash
# Validate docker-compose.yml without a Docker engine (`config` only parses,
# interpolates and schema-checks the file). The variables come from
# deploy/.env.example, exported into the environment: that works for both
# docker-compose 1.x and the `docker compose` plugin.
set -euo pipefail

cd "$(dirname "$0")/.."

compose_file=docker-compose.yml
env_file=deploy/.env.example

if command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
elif command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
else
    echo "docker-compose not installed: skipping compose validation"
    exit 0
fi

set -a
# shellcheck source=/dev/null
. "$env_file"
set +a

echo "validating $compose_file with $("${compose[@]}" version --short 2>/dev/null || echo "${compose[*]}")"
"${compose[@]}" -f "$compose_file" config -q
echo "ok: $compose_file is valid"
