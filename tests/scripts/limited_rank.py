"""``gaplan`` with a file-size limit on one rank only, for a test of a rank that cannot write its shards.

    torchrun --nproc-per-node 2 limited_rank.py RANK FSIZE_BYTES train ...

The rank whose RANK is the first argument sets its RLIMIT_FSIZE to the second (CPython ignores SIGXFSZ, so its
writes past it fail with EFBIG); every rank then runs the gaplan command line that follows.
"""

import os
import resource
import sys

import gaplan  # noqa: F401 - first, as `python -m gaplan` imports it

if __name__ == "__main__":
    rank, limit, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if os.environ.get("RANK") == rank:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    from gaplan.cli.main import main

    sys.argv = ["gaplan", *command]
    main()
