"""Where a study lives: storage URLs, heartbeats and the retry of a killed worker's trial.

Three kinds of URL:

- ``sqlite:///runs/xsearch.db``: one machine (the folder is created);
- ``postgresql+psycopg://user:password@host:5432/db`` (``postgresql://`` means the same: the psycopg 3
  driver ships with xsearch); ``mysql+DRIVER://...`` also works with its driver installed;
- ``journal:PATH``: Optuna's journal file, for machines that share a file system but no database. Its
  writers take turns through ``flock`` on ``PATH.flock`` (:class:`JournalFileFlock`), so the file system
  must honour locks across its machines (a local disk, NFSv4, NFSv3 with lockd); where it does not, use
  PostgreSQL.

Every storage a search opens records heartbeats: a worker's running trial whose heartbeat stops for
longer than the grace period (the worker was killed, its machine lost) is marked FAIL by whichever
worker looks next, and its parameters are queued again, once. Optuna's journal storage has no
heartbeats of its own; :class:`JournalHeartbeatStorage` adds them (the heartbeat is a timestamp in
the trial's system attributes, so the machines' clocks must agree to well within the grace period).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import threading
import time
import warnings
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat  # the interface Optuna's optimize loop checks for
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock  # the lock interface JournalFileBackend takes
from optuna.trial import TrialState

from xsearch.errors import UnavailableError, XSearchError

RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")
JOURNAL_PREFIX = "journal:"
HEARTBEAT_ATTR = "xsearch:heartbeat:"  # + trial id: a retried trial (a copy of the attrs) never inherits it
CONNECT_TIMEOUT_S = 10


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages): ``user:PASSWORD@`` and ``?password=``."""
    url = re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)
    return re.sub(r"([?&](?:password|passwd|pwd)=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def _passwords(url: str) -> list[str]:
    """The passwords written in ``url`` (in its user part or as a query parameter), to hide from messages."""
    found = [m.group(1) for m in re.finditer(r"://[^:/@]+:([^@]*)@", url)]
    found += [m.group(1) for m in re.finditer(r"[?&](?:password|passwd|pwd)=([^&#]*)", url, flags=re.IGNORECASE)]
    return [p for p in found if p]


def storage_kind(url: str) -> str:
    """``"sqlite"``, ``"postgresql"``, ``"mysql"`` or ``"journal"``.

    Raises:
        ValueError: an unknown scheme, naming the URL (password hidden).
    """
    if url.startswith(JOURNAL_PREFIX):
        if not url[len(JOURNAL_PREFIX) :].strip():
            raise XSearchError(f"storage {url!r}: give a file after 'journal:', e.g. journal:./runs/study.log")
        return "journal"
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    if scheme not in RDB_SCHEMES:
        raise XSearchError(
            f"unknown storage {mask_url(url)!r}: use sqlite:///FILE, postgresql+psycopg://USER:PASSWORD@HOST/DB "
            "or journal:FILE"
        )
    return "postgresql" if scheme == "postgres" else scheme


def _rdb_url(url: str) -> str:
    """A bare ``postgresql://`` (SQLAlchemy's default driver is psycopg2) goes through psycopg 3."""
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", url)


def open_storage(url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None) -> BaseStorage:
    """The Optuna storage behind ``url``.

    Args:
        url: see the module docstring.
        heartbeat_interval: seconds between a running trial's heartbeats (None: no heartbeats).
        grace_period: seconds without a heartbeat after which a running trial is stale (default: 3 intervals).

    Returns:
        A storage for ``optuna.create_study`` / ``load_study``. With heartbeats, a stale trial is failed and
        its parameters retried once (``RetryHeartbeatStaleTrialCallback(max_retry=1)``).

    Raises:
        ValueError: an unknown scheme, a bad interval, or a database that cannot be reached; the message
            names the URL with its password hidden.
    """
    kind = storage_kind(url)
    beat = {}
    if heartbeat_interval is not None:
        if heartbeat_interval < 1:
            raise XSearchError(f"heartbeat interval must be >= 1 s, got {heartbeat_interval}")
        grace_period = 3 * heartbeat_interval if grace_period is None else grace_period
        if grace_period <= heartbeat_interval:
            raise XSearchError(
                f"grace period ({grace_period} s) must exceed the heartbeat interval ({heartbeat_interval} s)"
            )
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = RetryHeartbeatStaleTrialCallback(max_retry=1)
        beat = dict(
            heartbeat_interval=heartbeat_interval, grace_period=grace_period, heartbeat_stale_trial_callback=retry
        )
    if kind == "journal":
        path = Path(url[len(JOURNAL_PREFIX) :]).expanduser()
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
        backend = JournalFileBackend(str(path), lock_obj=JournalFileFlock(str(path)))
        return JournalHeartbeatStorage(backend, **beat) if beat else JournalStorage(backend)
    if kind == "sqlite" and url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    engine_kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}} if kind == "postgresql" else None
    try:
        return _rdb_storage(_rdb_url(url), engine_kwargs, beat)
    except ImportError as e:
        raise UnavailableError(f"storage {mask_url(url)!r}: its database driver is not installed ({e})") from None
    except Exception as e:  # sqlalchemy's OperationalError & co: one line, no SQL, no password
        reason = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
        for password in _passwords(url):
            reason = reason.replace(password, "***")
        raise XSearchError(f"cannot open storage {mask_url(url)!r}: {reason}") from None


def _rdb_storage(url: str, engine_kwargs: dict | None, beat: dict, attempts: int = 5) -> RDBStorage:
    """``RDBStorage``, trying again when workers that start together race to create the tables of a new database."""
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(url, engine_kwargs=engine_kwargs, **beat)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as e:
            # SQLite reports the lost race as an OperationalError ("table ... already exists"); any other
            # OperationalError (a wrong host, a locked file) is not a race and is raised at once
            lost_race = not isinstance(e, sqlalchemy.exc.OperationalError) or "already exists" in str(e)
            if not lost_race or attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random())
    raise AssertionError("unreachable")


class JournalFileFlock(BaseJournalFileLock):
    """The journal's write lock: ``flock`` on ``PATH.flock``, which the kernel lets go when its holder dies.

    Optuna's own locks (a symlink or an ``O_EXCL`` file) are left behind by a worker killed while it
    writes; the other workers break such a lock after a 30 s grace period, and when several wait at once
    one of them can break the fresh lock another has just taken, so two write together and one fails with
    "did not possess lock" (measured: with the symlink lock every time, 3 waiters on a killed writer's
    lock). Nothing here is ever broken by a timer. The lock file stays beside the journal.
    """

    SUFFIX = ".flock"

    def __init__(self, filepath: str) -> None:
        self._path = filepath + self.SUFFIX
        self._threads = threading.Lock()  # flock excludes open files, not threads sharing this object
        self._fd: int | None = None

    def acquire(self) -> bool:
        self._threads.acquire()
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            self._threads.release()
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            raise RuntimeError(f"{self._path}: released without being held")
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._threads.release()


class JournalHeartbeatStorage(JournalStorage, BaseHeartbeat):
    """Optuna's journal storage with heartbeats, so a killed worker's trial is failed and retried.

    A heartbeat is the writer's ``time.time()`` stored in the trial's system attributes under a key that
    names the trial id.
    """

    def __init__(
        self, backend, *, heartbeat_interval: int, grace_period: int, heartbeat_stale_trial_callback=None
    ) -> None:
        super().__init__(backend)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.heartbeat_stale_trial_callback = heartbeat_stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        # A trial another worker already failed as stale cannot be written to; the optimize loop reports it.
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            self.set_trial_system_attr(trial_id, f"{HEARTBEAT_ATTR}{trial_id}", time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = t.system_attrs.get(f"{HEARTBEAT_ATTR}{t._trial_id}")
            if beat is not None and now - beat > self.grace_period:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self):
        return self.heartbeat_stale_trial_callback


def load_study(url: str, name: str) -> optuna.Study:
    """Load an existing study (of any kind xsearch writes) from the storage at ``url``.

    Raises:
        XSearchError: a bad or unreachable storage, or no study of that name (naming the ones there).
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=backend)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage=backend)]
        raise XSearchError(
            f"no study {name!r} in {mask_url(url)} (studies there: {', '.join(names) or 'none'})"
        ) from None
