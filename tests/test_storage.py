import multiprocessing
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import optuna
import pytest

from xsearch.cli import main
from xsearch.search.workers import fail_stale, within_total
from xsearch.storage import JournalFileFlock, JournalHeartbeatStorage, mask_url, open_storage, storage_kind


def closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_storage_kinds_and_bad_urls():
    assert storage_kind("sqlite:///runs/x.db") == "sqlite"
    assert storage_kind("postgresql+psycopg://u:p@127.0.0.1/db") == "postgresql"
    assert storage_kind("postgres://u:p@127.0.0.1/db") == "postgresql"
    assert storage_kind("journal:./runs/study.log") == "journal"
    assert mask_url("postgresql+psycopg://me:s3cr3t@host:5432/db") == "postgresql+psycopg://me:***@host:5432/db"
    assert mask_url("sqlite:///runs/x.db") == "sqlite:///runs/x.db"
    with pytest.raises(ValueError, match=r"unknown storage 'redis://me:\*\*\*@host/0'"):
        storage_kind("redis://me:s3cr3t@host/0")
    with pytest.raises(ValueError, match="journal:"):
        storage_kind("journal:")
    with pytest.raises(ValueError, match="grace period"):
        open_storage("sqlite:///:memory:", heartbeat_interval=5, grace_period=5)


def test_unreachable_database_is_one_line_naming_the_url_without_its_password(tmp_path, capsys):
    url = f"postgresql+psycopg://me:s3cr3t@127.0.0.1:{closed_loopback_port()}/db"
    with pytest.raises(ValueError) as e:
        open_storage(url)
    assert "me:***@127.0.0.1" in str(e.value) and "s3cr3t" not in str(e.value) and "\n" not in str(e.value)
    assert main(["report", "--storage", url, "--study", "s", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot open storage" in err and "s3cr3t" not in err
    assert main(["search", "--task", "listops", "--space", "tiny", "--storage", "mongodb://x"]) == 2
    assert "unknown storage 'mongodb://x'" in capsys.readouterr().err


def test_journal_storage_round_trip(tmp_path):
    url = f"journal:{tmp_path}/sub/study.log"
    study = optuna.create_study(storage=open_storage(url), study_name="s", directions=["maximize", "minimize"])
    study.optimize(lambda t: (t.suggest_float("x", 0, 1), 1.0), n_trials=2)
    again = optuna.load_study(study_name="s", storage=open_storage(url))
    assert [t.params for t in again.trials] == [t.params for t in study.trials]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask() stands in for a worker here
def test_a_trial_whose_heartbeat_stopped_is_failed_and_retried_once(tmp_path):
    # Journal storage with xsearch's heartbeats (RDB storages use Optuna's own, and the database's clock:
    # tests/test_search_workers.py kills real workers on PostgreSQL).
    storage = open_storage(f"journal:{tmp_path}/j.log", heartbeat_interval=1, grace_period=2)
    assert isinstance(storage, JournalHeartbeatStorage)
    study = optuna.create_study(storage=storage, study_name="s")

    def beat(trial, seconds_ago: float) -> None:
        with mock.patch("xsearch.storage.time.time", return_value=time.time() - seconds_ago):
            storage.record_heartbeat(trial._trial_id)

    dead = study.ask()
    dead.suggest_int("x", 0, 1000)
    beat(dead, 10)  # its worker died 10 s ago
    alive = study.ask()
    beat(alive, 0)
    fail_stale(study)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "RUNNING", "WAITING"]
    retry = trials[2]
    assert retry.params == trials[0].params and retry.system_attrs["failed_trial"] == dead.number
    # the retry runs next, and dies too: failed, and not retried a second time
    popped = study.ask()
    assert popped.number == retry.number and popped.params == dead.params
    beat(popped, 10)
    beat(alive, 0)
    fail_stale(study)
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "RUNNING", "FAIL"]


def test_within_total_counts_lower_numbered_live_trials():
    def trial(number, state):
        return optuna.trial.create_trial(
            state=getattr(optuna.trial.TrialState, state), value=0.0 if state == "COMPLETE" else None
        )

    trials = [trial(0, "COMPLETE"), trial(1, "FAIL"), trial(2, "RUNNING"), trial(3, "PRUNED"), trial(4, "WAITING")]
    for i, t in enumerate(trials):
        t.number = i
    # trial 5 has 3 live trials below it (0, 2, 4): it may run when the total is 4, not when it is 3
    assert within_total(trials, 5, 4) and not within_total(trials, 5, 3)
    assert within_total(trials, 2, 2) and not within_total(trials, 2, 1)


def _open_at(args: tuple[str, float]) -> str:
    url, start = args
    while time.time() < start:  # every process opens the new database at the same instant
        pass
    try:
        open_storage(url)
        return "ok"
    except ValueError as e:
        return str(e)


def test_workers_that_open_a_new_sqlite_database_together_all_get_it(tmp_path):
    """SQLite reports a lost race to create the tables as "table ... already exists"; each worker must retry."""
    import multiprocessing

    for round_ in range(3):
        url = f"sqlite:///{tmp_path}/race{round_}.db"
        with multiprocessing.get_context("fork").Pool(6) as pool:
            outcomes = pool.map(_open_at, [(url, time.time() + 0.5)] * 6)
        assert outcomes == ["ok"] * 6


def _count_under_lock(path: str, times: int) -> None:
    lock = JournalFileFlock(path)
    for _ in range(times):
        lock.acquire()
        try:  # a read-modify-write that loses counts unless the lock excludes the other writers
            counter = Path(path + ".count")
            n = int(counter.read_text() or 0) if counter.exists() else 0
            time.sleep(0.002)
            counter.write_text(str(n + 1))
        finally:
            lock.release()


def test_journal_lock_excludes_other_processes_and_threads(tmp_path):
    path = str(tmp_path / "study.log")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_count_under_lock, args=(path, 25)) for _ in range(2)]
    threads = [threading.Thread(target=_count_under_lock, args=(path, 25)) for _ in range(2)]
    for w in procs + threads:
        w.start()
    for w in procs + threads:
        w.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert Path(path + ".count").read_text() == str(4 * 25)


def test_a_writer_killed_holding_the_journal_lock_blocks_no_one(tmp_path):
    # Optuna's own locks stay behind a killed writer; waiters break them after 30 s, and several waiters
    # can break each other's fresh lock ("did not possess lock"). The kernel frees a flock at death.
    path = tmp_path / "study.log"
    holder = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from xsearch.storage import JournalFileFlock; "
            "JournalFileFlock(sys.argv[1]).acquire(); os.kill(os.getpid(), signal.SIGKILL)",
            str(path),
        ],
        timeout=120,
    )
    assert holder.returncode == -signal.SIGKILL
    errors = []

    def write(i: int) -> None:
        try:
            study = optuna.create_study(storage=open_storage(f"journal:{path}"), study_name="s", load_if_exists=True)
            study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
        except Exception as e:  # noqa: BLE001 - collected and shown by the assert
            errors.append(repr(e))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20  # well below Optuna's 30 s grace period: a lock left behind is still held
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads) and errors == []
    states = [t.state.name for t in optuna.load_study(study_name="s", storage=open_storage(f"journal:{path}")).trials]
    assert states == ["COMPLETE"] * 9
