"""Faults injected into a live daemon's disk layer (a test-only prelude to twistd).

``Daemon(..., code=faulty_daemon_code(), env={...})`` runs twistd after
replacing the default ``write_fn`` of every :class:`~nsqtw.storage.diskqueue.DiskQueue`
(the function its disk thread writes records with):

- ``NSQTW_TEST_DISK_FULL_FLAG=<path>``: while that file exists, writes fail
  with ENOSPC (a disk that fills up, where the test may not mount a tmpfs);
- ``NSQTW_TEST_DISK_BYTES_PER_SEC=<n>``: writes take ``len/n`` seconds (a disk
  slower than the publishers);
- ``NSQTW_TEST_FSYNC_FAIL_FLAG=<path>``: while that file exists, every fsync of
  the disk queues and journals (the node's timed fsync), and the syncfs a
  graceful stop makes for them, fails with EIO;
- ``NSQTW_TEST_EMFILE_FLAG=<path>``: while that file exists, every file a
  disk queue opens (its metadata, its segments) fails with EMFILE, as in a
  process out of descriptors;
- ``NSQTW_TEST_FSYNC_DELAY=<seconds>``: every such fsync and syncfs takes
  that long more (a disk whose fsyncs are slow);
- ``NSQTW_TEST_METADATA_FAIL_FLAG=<path>``: while that file exists, saving
  ``nsqd.dat`` fails with EIO (the metadata layer's ``write_state``);
- ``NSQTW_TEST_REPLACE_FULL_FLAG=<path>``: while that file exists, a file
  replaced whole (:func:`nsqtw.storage.atomic.atomic_write`: ``nsqd.dat``, a
  replica's notes and rewritten journals) takes half its bytes, then fails
  with ENOSPC, as a disk that fills in the middle of the write.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from tests.daemon import TWISTD


def install() -> None:
    from nsqtw.storage import diskqueue

    flag = os.environ.get("NSQTW_TEST_DISK_FULL_FLAG")
    rate = float(os.environ.get("NSQTW_TEST_DISK_BYTES_PER_SEC") or 0)

    def write(fd: int, data: Any) -> int:
        if flag and os.path.exists(flag):
            raise OSError(errno.ENOSPC, "No space left on device")
        if rate:
            time.sleep(len(data) / rate)
        return os.write(fd, data)

    defaults = diskqueue.DiskQueue.__init__.__kwdefaults__
    assert defaults is not None and "write_fn" in defaults
    defaults["write_fn"] = write

    open_flag = os.environ.get("NSQTW_TEST_EMFILE_FLAG")
    if open_flag:
        assert "open_fn" in defaults
        defaults["open_fn"] = fails_while(open_flag, os.open, errno.EMFILE)

    fsync_flag = os.environ.get("NSQTW_TEST_FSYNC_FAIL_FLAG")
    if fsync_flag:
        from nsqtw.storage.fsync import FsyncLatency

        FsyncLatency.fsync = fails_while(fsync_flag, FsyncLatency.fsync)  # type: ignore[method-assign]
        FsyncLatency.syncfs = fails_while(fsync_flag, FsyncLatency.syncfs)  # type: ignore[method-assign]

    fsync_delay = float(os.environ.get("NSQTW_TEST_FSYNC_DELAY") or 0)
    if fsync_delay:
        from nsqtw.storage.fsync import FsyncLatency

        FsyncLatency.fsync = slowed(fsync_delay, FsyncLatency.fsync)  # type: ignore[method-assign]
        FsyncLatency.syncfs = slowed(fsync_delay, FsyncLatency.syncfs)  # type: ignore[method-assign]

    replace_flag = os.environ.get("NSQTW_TEST_REPLACE_FULL_FLAG")
    if replace_flag:
        from nsqtw.storage import atomic

        whole = atomic.write_all

        def half_then_full(fd: int, data: bytes) -> None:
            if os.path.exists(replace_flag):
                whole(fd, data[:len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            whole(fd, data)

        atomic.write_all = half_then_full

    metadata_flag = os.environ.get("NSQTW_TEST_METADATA_FAIL_FLAG")
    if metadata_flag:
        from nsqtw.storage import metadata

        metadata.write_state = fails_while(metadata_flag, metadata.write_state)


def fails_while(flag: str, fn: Callable[..., Any], error: int = errno.EIO) -> Callable[..., Any]:
    """``fn``, failing with ``error`` (EIO) while the file ``flag`` exists."""

    def wrapped(*args: Any) -> Any:
        if os.path.exists(flag):
            raise OSError(error, os.strerror(error))
        return fn(*args)

    return wrapped


def slowed(seconds: float, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, after sleeping ``seconds``."""

    def wrapped(*args: Any) -> Any:
        time.sleep(seconds)
        return fn(*args)

    return wrapped


def faulty_daemon_code() -> str:
    """Python for ``Daemon(code=...)``: install the faults, then run twistd."""
    return "from tests.reliability.faults import install; install()\n" + TWISTD
