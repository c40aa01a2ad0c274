# bench/memory-cgroup.sh: sourced by the benchmarks that hold ranks to a
# memory limit (zero3-nowhere.sh, tensor-nowhere.sh). Sets `base` (where
# the memory cgroups go) and `limit_file` (the limit's file in one), for
# cgroup v1 or v2, or exits 2 naming the script ($1) when there is none.
if [ -d /sys/fs/cgroup/memory ]; then
  base=/sys/fs/cgroup/memory; limit_file=memory.limit_in_bytes
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  base=/sys/fs/cgroup; limit_file=memory.max
else
  echo "$1: no memory cgroup here (/sys/fs/cgroup)" >&2
  exit 2
fi
