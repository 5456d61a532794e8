"""Real disk faults for the chaos harness: each controller's metadata directory on its own tmpfs.

A full disk is a real ``ENOSPC`` from the kernel, not a simulated error: the controller's tmpfs
is shrunk to what it holds (``mount -o remount,size=``) and the last free bytes are filled, so
its next write that needs a new page fails. Freeing the disk removes the filler and gives the
size back. A wiped disk is the tmpfs emptied. Mounting needs root (or ``CAP_SYS_ADMIN``);
:func:`can_mount` says whether this machine allows it, and the harness leaves the disk fault
kinds out where it does not.

At the end :meth:`TmpfsDisks.release` copies each tmpfs' contents back onto the real directory
before unmounting, so the checker (and an operator after a failed run) reads them as usual.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOM = "1g"  # a tmpfs holds only what is written to it: this is a cap, not an allocation
SLACK_BYTES = 64 * 1024  # left free when shrinking, then filled by the filler file
FILLER = "chaos-disk-filler"


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


def can_mount() -> bool:
    """Whether a tmpfs can be mounted here (root in a sandbox that allows it)."""
    with tempfile.TemporaryDirectory(prefix="pykraft-mount-probe-") as d:
        if _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", d).returncode != 0:
            return False
        subprocess.run(["umount", d], capture_output=True, timeout=30)
        return True


class TmpfsDisks:
    """The tmpfs mounts of one chaos cluster, by directory."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []

    def mount(self, directory: Path) -> None:
        """Mount an empty tmpfs on ``directory`` (created, and empty, beforehand)."""
        directory.mkdir(parents=True, exist_ok=True)
        if any(directory.iterdir()):
            raise RuntimeError(f"{directory} is not empty: mount the tmpfs before formatting")
        proc = _mount("-t", "tmpfs", "-o", f"size={ROOM},mode=0755", "tmpfs", str(directory))
        if proc.returncode != 0:
            raise RuntimeError(f"mounting a tmpfs on {directory} failed: {proc.stderr.strip()}")
        self.mounted.append(directory)

    def fill(self, directory: Path) -> int:
        """Make ``directory``'s file system full; returns the bytes it holds."""
        for attempt in range(1, 6):  # the node writes meanwhile: a shrink below it fails
            st = os.statvfs(directory)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            size_kib = (used + attempt * SLACK_BYTES) // 1024 + 1
            proc = _mount("-o", f"remount,size={size_kib}k", str(directory))
            if proc.returncode == 0:
                break
        else:
            raise RuntimeError(f"shrinking the tmpfs on {directory} failed: {proc.stderr}")
        chunk = bytes(4096)
        with open(directory / FILLER, "ab", buffering=0) as f:
            for size in (len(chunk), 512, 1):
                try:
                    while True:
                        f.write(chunk[:size])
                except OSError:
                    continue
        return used

    def free(self, directory: Path) -> None:
        """Remove the filler and give the file system its room back."""
        (directory / FILLER).unlink(missing_ok=True)
        proc = _mount("-o", f"remount,size={ROOM}", str(directory))
        if proc.returncode != 0:
            raise RuntimeError(f"re-growing the tmpfs on {directory} failed: {proc.stderr}")

    def wipe(self, directory: Path) -> None:
        """Delete everything in ``directory`` (it stays, as a mount point)."""
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def release(self) -> None:
        """Copy each tmpfs' contents onto the directory underneath, then unmount it."""
        for directory in self.mounted:
            staging = directory.with_name(directory.name + ".from-tmpfs")
            try:
                (directory / FILLER).unlink(missing_ok=True)
                shutil.copytree(directory, staging, symlinks=True)
            finally:
                subprocess.run(["umount", "-l", str(directory)], capture_output=True, timeout=30)
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(staging, directory)
        self.mounted = []
