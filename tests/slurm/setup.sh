#!/usr/bin/env bash
# Start a real, local SLURM for the tests: munged, slurmctld and two slurmd ("n1", "n2") on this
# one machine, each node with 2 fake GPUs (GRES), one default partition "debug".
#
#   tests/slurm/setup.sh [STATE_DIR]      (root; default STATE_DIR=/tmp/lmpipe-slurm)
#   tests/slurm/teardown.sh [STATE_DIR]
#
# Installs Debian's munge/slurmctld/slurmd/slurm-client if missing. Daemons, spool, logs and pid
# files live in STATE_DIR; only slurm.conf and gres.conf go to /etc/slurm, because the SLURM
# commands a job runs (srun inside Snakemake's jobstep, which drops SLURM_CONF) read them there.
# A slurm.conf there that this script did not write is never touched: the script refuses instead.
# Exit status: 0 started (or already running), 2 cannot be started here (message on stderr).
set -euo pipefail

STATE=${1:-/tmp/lmpipe-slurm}
MARKER="# lmpipe test cluster (tests/slurm/setup.sh)"
CONF=/etc/slurm/slurm.conf

die() { echo "slurm setup: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (starts slurmctld/slurmd)"
if [ -f "$CONF" ] && ! grep -qF "$MARKER" "$CONF"; then
  die "$CONF exists and is not ours; refusing to replace a real SLURM configuration"
fi

# ---- packages --------------------------------------------------------------------------------
need=()
for p in munge slurmctld slurmd slurm-client; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing packages ${need[*]} and no apt-get"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}"; } >/dev/null 2>&1 ||
    die "could not install ${need[*]}"
fi

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Already up (e.g. started by .ci or an earlier test session)? Then reuse it.
if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd-n1.pid" && alive "$STATE/slurmd-n2.pid" &&
  sinfo -h >/dev/null 2>&1; then
  echo "slurm setup: already running ($STATE)"
  exit 0
fi

# A fresh start forgets every job of an earlier cluster in STATE: one left there by daemons that
# were killed (a machine restarted, a container snapshotted mid-test) would otherwise be recovered
# and run again, holding the nodes the tests need.
alive "$STATE/slurmctld.pid" || rm -rf "$STATE/ctld" "$STATE/spool" "$STATE/jobcomp.txt"
mkdir -p "$STATE"/{munge,ctld,spool,gpus}
chmod 700 "$STATE/munge"

# ---- munge: a private daemon, key and socket --------------------------------------------------
if ! alive "$STATE/munge/munged.pid"; then
  dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$STATE/munge/munge.key"
  munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" || die "munged did not start (see $STATE/munge)"
fi

# ---- slurm.conf: no cgroups, no accounting database; completed jobs stay visible in squeue
# (MinJobAge) and are recorded in a job completion file (sacct needs slurmdbd). -------------------
# Nodes claim at least 2 CPUs and 16 GB whatever the machine has (config_overrides): nothing is
# enforced without cgroups, and the tests' jobs must fit on a 1-core or small CI machine too.
cpus=$(( $(nproc) < 2 ? 2 : $(nproc) ))
mem_mb=16000
host=$(hostname -s)
for n in n1 n2; do for g in 0 1; do : >"$STATE/gpus/$n-gpu$g"; done; done # GRES wants files

cat >"$CONF" <<EOF
$MARKER: safe to delete when no test runs.
ClusterName=lmpipe
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
MinJobAge=3600
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
GresTypes=gpu
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:2 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
cat >/etc/slurm/gres.conf <<EOF
$MARKER
NodeName=n1 Name=gpu File=$STATE/gpus/n1-gpu[0-1]
NodeName=n2 Name=gpu File=$STATE/gpus/n2-gpu[0-1]
EOF

# ---- daemons ---------------------------------------------------------------------------------
alive "$STATE/slurmctld.pid" || slurmctld -c -i || die "slurmctld did not start ($STATE/slurmctld.log)"
# The slurmd run 5 nice levels above the default, and so do their jobs (SLURM's default
# PropagatePrioProcess=0: a job's tasks take slurmd's scheduling priority): the SLURM tests are
# the suite's longest chain of work, and under `make test` their jobs share the 2 cores with the
# other test workers, which take the CPU time the jobs leave.
for n in n1 n2; do
  mkdir -p "$STATE/spool/$n"
  alive "$STATE/slurmd-$n.pid" || nice -n -5 slurmd -N "$n" ||
    die "slurmd $n did not start ($STATE/slurmd-$n.log)"
done

for _ in $(seq 1 60); do
  if [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c '^idle')" = 2 ]; then
    echo "slurm setup: 2 nodes idle ($STATE)"
    exit 0
  fi
  sleep 0.5
done
sinfo -N >&2 || true
squeue --states=all >&2 || true
tail -n 20 "$STATE/slurmctld.log" >&2 || true
die "nodes did not become idle (logs in $STATE)"
