"""torchrun (torch.distributed.run) as Debian 12's python3-torch ships it,
with one fix: under Python 3.11, Std.from_str compares enum members with
ints and returns None for every --redirects/--tee value, so the agent fails
before starting a worker ("'NoneType' object has no attribute 'get'"). The
fix parses those values the way the option's help says; the elastic agent
itself is untouched. Used by bench/elastic.sh only.
"""

import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if vm.isdigit():
        return cls(int(vm))
    return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
