"""Drops files from this machine's page cache, so that the next read of
them comes from the disk: the cold-cache figures of bench/limits.sh.

    python3 bench/evict.py FILE...

Needs no root: posix_fadvise(DONTNEED) drops a file's clean pages. In a
virtual machine the host may still hold the file in its own cache, so a
"cold" read there is as fast as the host's cache, not its disk.
"""

import os
import sys

for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
