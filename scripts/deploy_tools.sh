#!/usr/bin/env bash
# Installs what the deployment tests use, from Debian's packages, when missing: the Docker engine and
# compose (tests/test_image.py), mmdebstrap (the debian:bookworm-slim base image without a registry)
# and promtool (the Prometheus config). Never fails the build: without them those tests skip, saying why.
set -uo pipefail
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v promtool >/dev/null || need+=(prometheus)
[[ ${#need[@]} -eq 0 ]] && exit 0
mkdir -p build
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "deploy-tools: missing ${need[*]} (no root/apt-get here): the deployment tests will skip"
  exit 0
fi
echo "deploy-tools: installing ${need[*]}"
{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"; } \
  > build/deploy-tools.log 2>&1 || echo "deploy-tools: apt-get failed (build/deploy-tools.log): those tests will skip"
exit 0
