"""Files the capture hook writes, written safely: created new (`O_EXCL`,
`O_NOFOLLOW`), never through a link another user planted in a shared
folder, under a temporary name and linked into place, never replacing a
file; and its one-line messages."""

import errno
import itertools
import os
import sys

# Flags of every file the hook creates: new, never through a link.
CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def warn(message):
    """One line on stderr, as every message of the hook is."""
    try:
        print(f"snapdiff: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def create_new(path, mode):
    """Opens `path` for writing as a new file: never one that exists, never
    through a symbolic link."""
    return os.fdopen(os.open(path, CREATE_NEW, 0o644), mode)


def publish(temporary, final):
    """Gives the written `temporary` the name `final`, which must not exist
    (a link planted there is refused, not replaced)."""
    try:
        os.link(temporary, final)
    except FileExistsError:
        raise
    except OSError:
        # A file system without hard links: rename, after checking.
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, "exists", final) from None
        os.rename(temporary, final)
        return
    os.unlink(temporary)


def append(path, data):
    """Appends `data` to the file at `path` in one write, creating it if
    needed; a symbolic link there is refused (OSError)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def describe(error):
    """An error as one line; a refused link says what it is."""
    if isinstance(error, OSError) and error.errno == errno.ELOOP:
        return f"{error.filename}: a symbolic link is there; not followed"
    if isinstance(error, FileExistsError):
        return f"{error.filename}: a file is already there; not replaced"
    return str(error)


def place(temporary, folder, stem):
    """Gives the written file its name without replacing any file:
    `stem.pickle`, else `stem-2.pickle`, ... Returns the name."""
    for n in itertools.count(1):
        name = f"{stem}.pickle" if n == 1 else f"{stem}-{n}.pickle"
        final = os.path.join(folder, name)
        try:
            os.link(temporary, final)
        except FileExistsError:
            continue
        except OSError:
            # A file system without hard links: rename, after checking.
            if os.path.lexists(final):
                continue
            os.rename(temporary, final)
            return name
        os.unlink(temporary)
        return name


def file_size(path):
    """The size of the file at `path`, 0 when it cannot be read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def append_byte(path):
    """Appends one byte to the file at `path`; a failure is ignored."""
    try:
        append(path, b".")
    except OSError:
        pass


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
