#!/usr/bin/python3
"""The environment both sides of a benchmark run in, from one place.

A comparison with a peer (PyTorch's DDP, its step, the GPT) is fair only when
both sides run with the same allocator and threads, as PyTorch's best users
run it: PyTorch's CPU launcher (`python -m torch.backends.xeon.run_cpu`)
preloads tcmalloc or jemalloc and sets OMP_NUM_THREADS. On Debian its search
(libtcmalloc.so, libjemalloc.so in /usr/lib) finds neither of Debian's
libraries, so this module sets what it would:

    launch_env.py env ALLOCATOR THREADS   # JSON: the variables to start a side with
    launch_env.py run ALLOCATOR THREADS COMMAND...   # COMMAND started with them
    launch_env.py report                  # JSON: what this process runs with

ALLOCATOR is glibc (none preloaded), tcmalloc (libtcmalloc-minimal4) or
jemalloc (libjemalloc2, with run_cpu's MALLOC_CONF). Every variable it
controls is always given, empty meaning unset, so nothing leaks in from the
caller. COHORT_BENCH_EXPECT in it tells a peer what it must find:
verify(torch) exits 3 naming the setting when the process runs otherwise,
so a peer started with another allocator or thread count fails rather than
gives a figure (tests/bench/launch_env_test.cc). cohort's side reports the
same in summary.json's "compute" (malloc, intra_op_threads).
COHORT_BENCH_BIND_CORES=1 in it has each peer rank call bind() before its
first tensor: held to cores of its own by cohort's rule for
compute.bind_cores: auto (the ranks' threads fill the cores: rank r takes
the r-th slice), as PyTorch's CPU launcher binds each instance with numactl;
the report then says whether it did ("bind_cores"), beside cohort's.
Only the standard library: the C++ benchmarks call it before starting a side.
"""
import json
import os
import sys

LIBRARIES = {"tcmalloc": "libtcmalloc_minimal.so.4", "jemalloc": "libjemalloc.so.2"}
# What torch.backends.xeon.run_cpu sets with jemalloc (PyTorch 1.13).
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
CONTROLLED = ("LD_PRELOAD", "MALLOC_CONF", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "COHORT_BENCH_BIND_CORES")
SEARCH = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
          "/usr/local/lib")


def library_path(allocator):
    """The file to preload for `allocator`; SystemExit naming the package
    when it is not installed."""
    name = LIBRARIES[allocator]
    for d in SEARCH:
        path = os.path.join(d, name)
        if os.path.exists(path):
            return path
    package = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}[allocator]
    sys.exit(f"launch_env: {name} not found in {', '.join(SEARCH)} (apt-get install {package})")


def environment(allocator, threads):
    """The variables a side of a benchmark starts with."""
    if allocator != "glibc" and allocator not in LIBRARIES:
        sys.exit(f"launch_env: allocator {allocator!r}: expected glibc, tcmalloc or jemalloc")
    if threads < 1:
        sys.exit(f"launch_env: {threads} threads: expected 1 or more")
    env = dict.fromkeys(CONTROLLED, "")
    if allocator != "glibc":
        env["LD_PRELOAD"] = library_path(allocator)
    if allocator == "jemalloc":
        env["MALLOC_CONF"] = JEMALLOC_CONF
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env["COHORT_BENCH_EXPECT"] = json.dumps({"malloc": allocator, "intra_op_threads": threads})
    env["COHORT_BENCH_BIND_CORES"] = "1"
    return env


_bound = False


def bind(rank, world, threads):
    """Under COHORT_BENCH_BIND_CORES=1, holds this thread (and the threads
    it starts later: call it before torch starts its pool) to rank's slice of
    the allowed cores when world x threads fill them exactly, as cohort's
    compute.bind_cores: auto does for its local ranks. Returns whether it
    bound."""
    global _bound
    if os.environ.get("COHORT_BENCH_BIND_CORES") != "1":
        return False
    allowed = sorted(os.sched_getaffinity(0))
    if world * threads != len(allowed):
        return False
    os.sched_setaffinity(0, allowed[rank * threads:(rank + 1) * threads])
    _bound = True
    return True


def describe_cores(cores):
    """'0-3,6' for {0, 1, 2, 3, 6}, as cohort's summary.json writes them."""
    cores, out, i = sorted(cores), [], 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        out.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(out)


def serving_malloc():
    """(name, library): tcmalloc or jemalloc when its library is loaded in
    this process (preloaded, it serves every malloc; nothing else here loads
    one), else glibc and libc's path."""
    libc = "?"
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 6:
                continue
            base = os.path.basename(fields[5])
            for name in ("tcmalloc", "jemalloc"):
                if base.startswith("lib" + name):
                    return name, fields[5]
            if base.startswith("libc.so") or base.startswith("libc-"):
                libc = fields[5]
    return "glibc", libc


def report(torch=None):
    """What this process runs with; the threads when `torch` is given."""
    name, library = serving_malloc()
    out = {"malloc": name, "malloc_library": library,
           "ld_preload": os.environ.get("LD_PRELOAD", ""),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
    if torch is not None:
        out["intra_op_threads"] = torch.get_num_threads()
        out["inter_op_threads"] = torch.get_num_interop_threads()
    out["cores"] = describe_cores(os.sched_getaffinity(0))
    if os.environ.get("COHORT_BENCH_BIND_CORES") == "1":
        out["bind_cores"] = _bound
    return out


def verify(torch):
    """report(torch), after checking it against COHORT_BENCH_EXPECT (when the
    harness set it): on a difference, a message naming each setting on
    stderr and exit 3."""
    got = report(torch)
    expected = json.loads(os.environ.get("COHORT_BENCH_EXPECT") or "{}")
    wrong = [f"{key} is {got.get(key)!r}, the benchmark expects {want!r}"
             for key, want in expected.items() if got.get(key) != want]
    if wrong:
        print(f"{os.path.basename(sys.argv[0])}: not started as the benchmark says: " + "; ".join(wrong) +
              f" (LD_PRELOAD={got['ld_preload']!r})", file=sys.stderr, flush=True)
        sys.exit(3)
    return got


def run(allocator, threads, command):
    """Replaces this process with `command` under environment(): a variable
    given empty is unset."""
    env = dict(os.environ)
    for key, value in environment(allocator, threads).items():
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    os.execvpe(command[0], command, env)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "env":
        print(json.dumps(environment(sys.argv[2], int(sys.argv[3]))))
        return 0
    if len(sys.argv) >= 5 and sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    if len(sys.argv) == 2 and sys.argv[1] == "report":
        print(json.dumps(report()))
        return 0
    print("usage: launch_env.py env|run glibc|tcmalloc|jemalloc THREADS [COMMAND...] | launch_env.py report",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
