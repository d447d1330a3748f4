"""How an export's files reach the model repository: written beside it first, then swapped in.

Triton takes every folder of a repository for a model (hidden ones too, and `--load-model=*` fails to
start on one that is not), so an export is staged outside the repository and its stages are moved in
only once they are verified and complete: a failed (re-)export leaves the model that was there, and a
server never finds half of one.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

STAGING_PREFIX = ".pooltriton-export-"
INCOMING_PREFIX = f"{STAGING_PREFIX}incoming~"


def write_json(path: Path, data: dict) -> None:
    """A file an export writes beside a stage (verification.json, pooler_config.json), stable for diffs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def staging_folder(out: Path, name: str) -> Path:
    """A new folder for an export's files, beside the repository rather than in it (Triton takes every
    folder of a repository for a model, hidden ones too, and `--load-model=*` fails on one that is not),
    on the repository's filesystem where its parent is writable, so that moving the stages in is a rename.
    Named after the repository's path, the model (names cannot hold '~'), this host and this process: a
    killed export's folder is removed by this host's next export of that model, a running one's is not."""
    out.mkdir(parents=True, exist_ok=True)
    repository = out.resolve()
    base = repository.parent if os.access(repository.parent, os.W_OK) else Path(tempfile.gettempdir())
    prefix = f"{STAGING_PREFIX}{hashlib.sha1(str(repository).encode()).hexdigest()[:12]}~{name}~{host_prefix()}"
    for folder, start in ((base, prefix), (repository, INCOMING_PREFIX + host_prefix())):  # (publish's)
        for stale in folder.glob(f"{glob.escape(start)}*"):
            pid = stale.name[len(start):].split(".", 1)[0]
            if not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=base))


def host_prefix() -> str:
    """This host's part of a staging folder's name (a folder shared between hosts: each cleans its own)."""
    return f"{hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]}~"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def publish(staging: Path, out: Path, names: Iterable[str]) -> None:
    """Swap the staged stages in for the model's previous ones by renames within the repository's
    filesystem (staged on another, they are copied in under a hidden name first): the old ones (a stage
    this export no longer has too) go aside, the ensemble first, and the new ones come in, the ensemble
    last, so that it never names a stage that is not there. Any failure puts the old model back."""
    names = list(names)
    incoming = staging
    if not _same_filesystem(staging, out):
        incoming = Path(tempfile.mkdtemp(prefix=f"{INCOMING_PREFIX}{host_prefix()}{os.getpid()}.", dir=out))
    retired = incoming / ".retired"  # (no model name starts with '.')
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        if incoming is not staging:
            for stage in names:
                if (staging / stage).exists():
                    shutil.copytree(staging / stage, incoming / stage, symlinks=True)
        retired.mkdir(exist_ok=True)
        for stage in names:
            if (out / stage).exists() or (out / stage).is_symlink():
                _move(out / stage, retired / stage)
                moved_out.append(stage)
        for stage in reversed(list(names)):
            if (incoming / stage).exists():
                _move(incoming / stage, out / stage)
                moved_in.append(stage)
    except BaseException:
        for source, target in [*((out / s, incoming / s) for s in reversed(moved_in)),
                               *((retired / s, out / s) for s in reversed(moved_out))]:
            with contextlib.suppress(OSError):  # the first error is the one to report
                _move(source, target)
        raise
    finally:
        if incoming is not staging:
            shutil.rmtree(incoming, ignore_errors=True)


def _move(source: Path, target: Path) -> None:
    """A rename; copied and removed where the filesystem cannot rename it (EXDEV: overlayfs moving a folder
    of a lower image layer, a bind mount), as that one stage's move then must be."""
    try:
        source.rename(target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, symlinks=True)
            shutil.rmtree(source)
        else:
            shutil.move(source, target)
