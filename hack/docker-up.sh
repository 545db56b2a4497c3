#!/usr/bin/env bash
# Makes sure a Docker engine runs on this machine, installing Debian's docker.io if needed.
# Idempotent: an engine that already answers is left alone.
#
# This project's build machines withhold CAP_SYS_RESOURCE from every process, so privileged
# containers (Kind nodes) fail in runc; the engine is set up with hack/kind/runc-wrapper.sh as its
# default runtime, which removes that one capability from each container's spec.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
wrapper=/usr/local/bin/strata-runc
log=/var/log/strata-dockerd.log

if docker info >/dev/null 2>&1; then
  exit 0
fi

[ "$(id -u)" = 0 ] || { echo "docker-up.sh: no Docker engine answers and installing one needs root" >&2; exit 1; }

if ! command -v dockerd >/dev/null || ! command -v jq >/dev/null; then
  echo "installing docker.io and jq from Debian" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io jq >/dev/null
fi

real_runc=$(command -v runc)
sed "s|^REAL_RUNC=.*|REAL_RUNC=${real_runc}|" "$here/kind/runc-wrapper.sh" > "$wrapper.tmp"
chmod 0755 "$wrapper.tmp" && mv "$wrapper.tmp" "$wrapper"

mkdir -p /etc/docker
if [ -f /etc/docker/daemon.json ] && ! jq -e --arg w "$wrapper" '.runtimes.wrap.path == $w and ."default-runtime" == "wrap"' /etc/docker/daemon.json >/dev/null; then
  cp /etc/docker/daemon.json /etc/docker/daemon.json.before-strata
  jq --arg w "$wrapper" '.runtimes.wrap = {path: $w} | ."default-runtime" = "wrap"' /etc/docker/daemon.json.before-strata > /etc/docker/daemon.json
elif [ ! -f /etc/docker/daemon.json ]; then
  jq -n --arg w "$wrapper" '{runtimes: {wrap: {path: $w}}, "default-runtime": "wrap"}' > /etc/docker/daemon.json
fi

if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl restart docker
else
  # No init system in this sandbox: run the daemon in the background ourselves.
  pkill -x dockerd 2>/dev/null || true
  nohup dockerd >"$log" 2>&1 &
fi

for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "Docker engine ready ($(docker version --format '{{.Server.Version}}'))" >&2
    exit 0
  fi
  sleep 1
done
echo "docker-up.sh: the Docker engine did not answer within 60 s; its log is $log:" >&2
tail -20 "$log" >&2 || true
exit 1
