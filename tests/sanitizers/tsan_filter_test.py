#!/usr/bin/env python3
"""tsan_filter.py sets aside only frees made by libtorch_cpu.so itself."""
import os
import subprocess
import sys
import tempfile

FILTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tsan_filter.py")
SEP = "=================="


def report(current, previous):
    return "\n".join([SEP, "WARNING: ThreadSanitizer: data race (pid=1)", current, "", previous,
                      "", "SUMMARY: ThreadSanitizer: data race", SEP, ""])


LIBTORCH_FREE = """  Write of size 8 at 0x7b2000365100 by thread T5 (mutexes: write M1):
    #0 operator delete(void*, unsigned long) ../../../../src/libsanitizer/tsan/tsan_new_delete.cpp:150 (libtsan.so.2+0x86c3d)
    #1 <null> <null> (libtorch_cpu.so.1.13+0x2812b4b)"""
COHORT_READ = """  Previous read of size 8 at 0x7b2000365100 by main thread:
    #0 cohort::train::train() /work/src/train/trainer.cc:806 (cohort+0x193067)"""
COHORT_FREE = """  Write of size 8 at 0x7b2000365100 by thread T2:
    #0 free ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:706 (libtsan.so.2+0x47e82)
    #1 cohort::ckpt::Checkpointer::writerLoop() /work/src/ckpt/checkpointer.cc:300 (cohort+0x1234)"""
COHORT_WRITE = """  Write of size 4 at 0x7b2000365100 by thread T2:
    #0 cohort::data::BatchLoader::work() /work/src/data/loader.cc:80 (cohort+0x4321)"""
LIBTORCH_FREE_BEFORE = """  Previous write of size 8 at 0x7b2000365100 by thread T5:
    #0 free ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:706 (/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13+0x47e82)
    #1 <null> <null> (/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13+0xd542a2)"""


def verdict(text):
    with tempfile.NamedTemporaryFile("w", suffix=".tsan", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, FILTER, f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def main():
    failures = []
    cases = [
        ("a free inside libtorch_cpu.so against cohort's read", report(LIBTORCH_FREE, COHORT_READ), 0),
        ("a free in cohort's code", report(COHORT_FREE, COHORT_READ), 1),
        ("cohort's write after libtorch freed", report(COHORT_WRITE, LIBTORCH_FREE_BEFORE), 1),
        ("one set aside and one kept", report(LIBTORCH_FREE, COHORT_READ) + report(COHORT_FREE, COHORT_READ), 1),
    ]
    for name, text, want in cases:
        r = verdict(text)
        if r.returncode != want:
            failures.append(f"{name}: exit {r.returncode}, expected {want}\n{r.stdout}{r.stderr}")
    for f in failures:
        print("FAILED:", f)
    print(f"{len(cases) - len(failures)} of {len(cases)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
