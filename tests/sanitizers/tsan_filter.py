#!/usr/bin/env python3
"""Separates ThreadSanitizer reports that are inside LibTorch from the rest.

    tsan_filter.py REPORT_FILE...

Prints every report that is not recognised below and exits 1 if there was
one; prints how many were recognised. Used by scripts/sanitize.sh thread
(docs/security.md, "Sanitizers").

Recognised, and only this: a data race whose current access is a free
(`free`, `operator delete`) called directly from libtorch_cpu.so. LibTorch
releases tensors and c10d Work objects through atomic reference counts; the
last decrement may happen on a Gloo worker thread, inside libtorch_cpu.so,
which is not instrumented. TSan then sees the free without the decrement
that ordered it after the rank thread's last use, and reports that use as a
race. The reference count's own accesses are atomic; the free is LibTorch's.
No suppression can name these reports: the freeing frame has no symbol
(Debian's LibTorch has none for it), and a suppression by module would also
hide races in cohort code that LibTorch calls back (autograd hooks). The
reports stay in the report directory for anyone to read.
"""
import re
import sys

SEPARATOR = "=================="
ACCESS = re.compile(r"^  (Write|Read|Atomic \w+) of size \d+ at 0x[0-9a-f]+ by (main thread|thread T\d+)")
# "    #1 <function> <file:line> (<module>+0x<offset>)": the module is the
# last parenthesis of the line (a function's own parentheses come before).
FRAME = re.compile(r"^    #(\d+) (\S+).* \((\S+?)\+0x[0-9a-f]+\)\s*$")
FREE = {"free", "operator"}  # "operator delete(void*, ...)" starts with "operator"


def reports(text):
    """The blocks between SEPARATOR lines that hold a WARNING."""
    block, inside = [], False
    for line in text.splitlines():
        if line == SEPARATOR:
            if inside and block:
                yield block
            block, inside = [], not inside
            continue
        if inside:
            block.append(line)


def inside_libtorch_free(block):
    if not block or "WARNING: ThreadSanitizer: data race" not in block[0]:
        return False
    frames = []
    seen_access = False
    for line in block[1:]:
        if ACCESS.match(line):
            if seen_access:
                break
            seen_access = True
            continue
        if not seen_access:
            continue
        m = FRAME.match(line)
        if not m:
            break
        frames.append((m.group(2), m.group(3)))
    if len(frames) < 2:
        return False
    (fn0, _), (_, module1) = frames[0], frames[1]
    # The module is printed as a path or a bare file name.
    return fn0 in FREE and module1.rsplit("/", 1)[-1].startswith("libtorch_cpu.so")


def main(paths):
    recognised, left = 0, []
    for path in paths:
        with open(path, errors="replace") as f:
            text = f.read()
        for block in reports(text):
            if inside_libtorch_free(block):
                recognised += 1
            else:
                left.append((path, block))
    for path, block in left:
        print(f"=== {path}")
        print(SEPARATOR)
        print("\n".join(block))
        print(SEPARATOR)
    print(f"tsan_filter: {recognised} report(s) of frees inside libtorch_cpu.so set aside "
          f"(docs/security.md); {len(left)} other report(s)", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
