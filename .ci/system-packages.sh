#!/usr/bin/env bash
# Debian packages for the browser test (chromium) and the local SLURM tests (munge, slurm).
set -euo pipefail
# munge slurmctld slurmd slurm-client: tests/test_slurm.py starts them (tests/slurm/setup.sh).
pkgs=(chromium munge slurmctld slurmd slurm-client)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing ${missing[*]}, and installing them needs root and apt-get" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
