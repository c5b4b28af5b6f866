"""Replacing a file so a crash leaves either the old or the new contents, never a mix.

nsqd's metadata (``nsqd.dat``), go-diskqueue's ``.meta.dat`` files and
nsqtw's journal snapshots are all replaced the same way: write a temporary
file beside the target, fsync it, rename it over the target, and (where the
name must survive power loss) fsync the directory. Disk thread only.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable

__all__ = ["atomic_write", "check_room", "free_bytes", "fsync_dir", "remove_quietly", "temp_name", "write_all",
           "write_temp"]

_random = random.SystemRandom()


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is taken (a write may take only part)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a new or renamed file's name) survive power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_room(path: str, need: int, keep_free: int, kept_for: str) -> None:
    """Fail with ENOSPC if writing ``need`` bytes would leave less than ``keep_free`` free.

    The disk's last bytes are shared out in layers (see
    :func:`nsqtw.storage.durable.keep_free`): a writer that may not take
    them is refused here, before it writes anything, and the refusal reads
    like the disk's own ("No space left on device") with what the rest is
    ``kept_for``.
    """
    if free_bytes(path) < keep_free + need:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (the last {keep_free} bytes are kept"
                                    f" for {kept_for})")


def remove_quietly(path: str) -> None:
    """Remove ``path``; a file that is already gone is fine."""
    try:
        os.remove(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


def temp_name(path: str) -> str:
    """A fresh temporary name beside ``path``."""
    return f"{path}.{_random.getrandbits(63)}.tmp"


def write_temp(path: str, data: bytes, open_fn: Callable[..., int] = os.open) -> str:
    """Write ``data`` to a new temporary file beside ``path``, without an fsync; its name.

    The first half of :func:`atomic_write` for writers whose fsyncs one
    ``syncfs`` makes for all (:mod:`nsqtw.storage.groupsync`): the caller
    renames it over ``path`` once the filesystem is synced.
    """
    tmp = temp_name(path)
    fd = open_fn(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        remove_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def atomic_write(path: str, data: bytes, *, fsync: Callable[[int], None] = os.fsync,
                 ignore_fsync_error: bool = False, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, then the directory's fsync.

    ``fsync`` is injectable so tests can make it fail. ``ignore_fsync_error``
    keeps go-diskqueue's rule for its metadata (a failed temp-file sync is
    not an error); ``sync_dir=False`` skips the directory fsync where the
    Go code it mirrors does not do it. On any failure the temp file is gone
    and ``path`` is untouched.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        try:
            fsync(fd)
        except OSError:
            if not ignore_fsync_error:
                raise
    except BaseException:
        os.close(fd)
        remove_quietly(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(os.path.dirname(path) or ".")
