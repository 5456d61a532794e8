"""A class-data-sharing (CDS) archive of the classes the audit's Spark driver JVM loads.

Starting a local SparkSession spends most of its ~6 s loading and verifying some 20,000 Spark,
Scala and Hadoop classes. The JVM can map them from an archive written by an earlier run
instead (``-XX:SharedArchiveFile``), which roughly halves session start (docs/performance.md).

The archive is written once per JVM + Spark installation by ``python -m tools.audit.classdata``
(``make jvm-archive`` runs it, from a source checkout): a real audit of a small sample log
(``testsupport/classdata_train.py``) in a JVM started with
``-XX:ArchiveClassesAtExit``. It is keyed by everything the JVM checks (the java binary, the
class path's jars, ``SPARK_CONF_DIR``), so a new JDK or pyspark gets a new archive; a JVM that
still finds it unusable ignores it silently and starts the slow way. Writing one deletes the
archives of other installations that no session has mapped for 30 days. ``KRAFT_AUDIT_CDS=off``
turns it off; ``KRAFT_AUDIT_CDS_DIR`` says where archives live (default
``$XDG_CACHE_HOME/pykraft`` or ``~/.cache/pykraft``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Unified JVM logging off for CDS: an archive the JVM rejects (another JDK build, a changed
#: class path) or a class it cannot archive would otherwise print warnings on our stdout.
QUIET = " -Xlog:cds*=off"
#: How long writing the archive may take (a small audit plus the JVM's dump at exit).
CREATE_TIMEOUT_S = 600.0
#: Archives of other installations unused this long are deleted when a new one is written
#: (each is ~180 MiB; a session that maps an archive marks it used).
UNUSED_FOR_S = 30 * 86400


def enabled() -> bool:
    return os.environ.get("KRAFT_AUDIT_CDS", "on").lower() not in ("off", "0", "false", "no")


def _java() -> Path | None:
    """The java binary Spark's launcher will run (``JAVA_HOME`` first, as spark-class does)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def _spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()).resolve()


def _conf_dir() -> Path:
    """The directory Spark's launcher puts first on the driver's class path."""
    return Path(os.environ.get("SPARK_CONF_DIR") or _spark_home() / "conf")


def blocker() -> str | None:
    """Why no archive can be used here, or None. The JVM refuses to archive classes when a
    non-empty directory is on the class path, and Spark puts ``SPARK_CONF_DIR`` there."""
    if not enabled():
        return "KRAFT_AUDIT_CDS is off"
    if _java() is None:
        return "no java found (JAVA_HOME or PATH)"
    conf = _conf_dir()
    if conf.is_dir() and any(conf.iterdir()):
        return (
            f"SPARK_CONF_DIR {conf} is a non-empty directory on the JVM's class path "
            "(the JVM archives classes from jar files only)"
        )
    return None


def archive_path() -> Path | None:
    """Where this installation's archive lives (None when no archive can be used here)."""
    if blocker() is not None:
        return None
    java = _java()
    assert java is not None
    jars = _spark_home() / "jars"
    h = hashlib.sha256()
    for part in (java, java.stat().st_size, java.stat().st_mtime_ns, _conf_dir(), jars):
        h.update(f"{part}\0".encode())
    for jar in sorted(jars.glob("*.jar")):
        st = jar.stat()
        h.update(f"{jar.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    base = os.environ.get("KRAFT_AUDIT_CDS_DIR") or (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pykraft"
    )
    return Path(base) / f"spark-classes-{h.hexdigest()[:16]}.jsa"


def java_options() -> str:
    """The driver JVM's options for the archive: using it when it exists, writing it when this
    process is the one creating it (``KRAFT_AUDIT_CDS_DUMP``); "" otherwise."""
    dump = os.environ.get("KRAFT_AUDIT_CDS_DUMP")
    if dump:
        return f" -XX:ArchiveClassesAtExit={dump}" + QUIET
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    try:
        os.utime(path)  # used now: see prune()
    except OSError:
        pass
    return f" -XX:SharedArchiveFile={path}" + QUIET


def create(force: bool = False, timeout: float = CREATE_TIMEOUT_S) -> tuple[Path | None, str]:
    """Write the archive unless it exists (``force``: rewrite it). Returns (path, what
    happened); path None when no archive can be used here."""
    why = blocker()
    if why is not None:
        return None, f"no JVM class archive: {why}"
    path = archive_path()
    assert path is not None
    if path.is_file() and not force:
        return path, f"JVM class archive present: {path}"
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "testsupport" / "classdata_train.py").is_file():
        return None, (
            "no JVM class archive: writing one runs testsupport/classdata_train.py, "
            "which only a source checkout has"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="kraft-cds-") as work:
        env = {**os.environ, "KRAFT_AUDIT_CDS_DUMP": str(partial)}
        proc = subprocess.run(
            [sys.executable, "-m", "testsupport.classdata_train", work],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=checkout,
        )
        if proc.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            partial.unlink(missing_ok=True)
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise RuntimeError(
                "writing the JVM class archive failed (exit "
                f"{proc.returncode}): " + " | ".join(tail)
            )
    os.replace(partial, path)  # readers never see a half-written archive
    gone = prune(path)
    return path, (
        f"JVM class archive written: {path} ({path.stat().st_size >> 20} MiB)"
        + (f"; {len(gone)} unused for {UNUSED_FOR_S // 86400} days deleted" if gone else "")
    )


def prune(keep: Path, unused_for: float = UNUSED_FOR_S) -> list[Path]:
    """Delete the archives beside ``keep`` (other JDKs or Spark installations) that no session
    has used for ``unused_for`` seconds; returns them."""
    cutoff = time.time() - unused_for
    gone = []
    for other in keep.parent.glob("spark-classes-*.jsa"):
        try:
            if other != keep and other.stat().st_mtime < cutoff:
                other.unlink()
                gone.append(other)
        except OSError:  # another process's, or already gone
            continue
    return gone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write the audit's JVM class archive (makes Spark "
        "start ~3 s faster); a no-op when it exists."
    )
    ap.add_argument("--force", action="store_true", help="rewrite an existing archive")
    args = ap.parse_args(argv)
    try:
        _, what = create(force=args.force)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(
            f"warning: {e}; the audit works without it, Spark just starts slower", file=sys.stderr
        )
        return 1
    print(what)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
