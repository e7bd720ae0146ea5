#!/usr/bin/env bash
# Stop the local test SLURM that tests/slurm/setup.sh started, by its pid files (never by name),
# and remove the /etc/slurm files it wrote (only when they carry its marker).
#   tests/slurm/teardown.sh [STATE_DIR]      (default STATE_DIR=/tmp/lmpipe-slurm)
set -uo pipefail

STATE=${1:-/tmp/lmpipe-slurm}
MARKER="# lmpipe test cluster (tests/slurm/setup.sh)"

# Cancel leftover jobs first, so no job step outlives its slurmd.
if [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
  scancel --full --quiet --partition=debug 2>/dev/null || true
fi

stop() { # stop <pidfile>: SIGTERM, wait up to 10 s, then SIGKILL
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$f"
}

stop "$STATE/slurmd-n1.pid"
stop "$STATE/slurmd-n2.pid"
stop "$STATE/slurmctld.pid"
stop "$STATE/munge/munged.pid"

for f in /etc/slurm/slurm.conf /etc/slurm/gres.conf; do
  [ -f "$f" ] && grep -qF "$MARKER" "$f" && rm -f "$f"
done
echo "slurm teardown: stopped ($STATE)"
