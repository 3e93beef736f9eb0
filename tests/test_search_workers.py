"""Many `xsearch search` processes on one study: the exact total, and a SIGKILLed worker's trial failed by the
heartbeat check and retried.

PostgreSQL: set XSEARCH_TEST_POSTGRES to a database URL (`.ci/start-postgres` starts one and prints it); the
test skips without it, and fails instead when XSEARCH_REQUIRE_POSTGRES=1 (as in CI). The journal file storage
needs no server and always runs.
"""

import os
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest

from xsearch.storage import open_storage

TASK_OPTS = {"n_train": 64, "n_valid": 32, "n_test": 16, "min_len": 16, "max_len": 64, "max_depth": 4}
TOTAL = 6
DEADLINE_S = 120


def postgres_url() -> str:
    url = os.environ.get("XSEARCH_TEST_POSTGRES")
    required = os.environ.get("XSEARCH_REQUIRE_POSTGRES") == "1"
    if not url:
        if required:
            pytest.fail("XSEARCH_REQUIRE_POSTGRES=1 but XSEARCH_TEST_POSTGRES is not set")
        pytest.skip("set XSEARCH_TEST_POSTGRES=postgresql+psycopg://... (.ci/start-postgres prints one)")
    try:
        open_storage(url)
    except ValueError as e:
        if required:
            pytest.fail(f"XSEARCH_REQUIRE_POSTGRES=1 but the server is unreachable: {e}")
        pytest.skip(f"PostgreSQL unreachable: {e}")
    return url


@pytest.fixture(params=["postgresql", "journal"])
def storage_url(request, tmp_path):
    return postgres_url() if request.param == "postgresql" else f"journal:{tmp_path}/study.log"


def worker(url: str, study: str, tmp_path, i: int) -> subprocess.Popen:
    opts = sum((["--task-opt", f"{k}={v}"] for k, v in TASK_OPTS.items()), [])
    cmd = [sys.executable, "-m", "xsearch.cli", "search", "--task", "listops", *opts, "--space", "tiny",
           "--target", "torch-cpu", "--threads", "1", "--trials", str(TOTAL), "--train-steps", "10",
           "--batch-size", "16", "--storage", url, "--study", study, "--heartbeat-interval", "1",
           "--grace-period", "3", "--quiet"]  # fmt: skip
    env = {**os.environ, "XSEARCH_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / f"worker{i}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def trials_of(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=study, storage=open_storage(url)).get_trials(deepcopy=False)
    except KeyError:  # not created yet
        return []


def test_three_workers_one_killed_exact_total_and_retry(storage_url, tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = f"workers-{uuid.uuid4().hex[:12]}"
    procs = [worker(storage_url, study, tmp_path, i) for i in range(3)]
    try:
        # Wait until one of the workers is inside a trial (its model built), then SIGKILL that worker.
        by_pid = {p.pid: p for p in procs}
        victim = killed = None
        start = time.monotonic()
        while victim is None:
            assert time.monotonic() - start < DEADLINE_S, "no worker started a trial"
            assert all(p.poll() is None for p in procs), "a worker exited before any trial ran"
            for t in trials_of(storage_url, study):
                pid = (t.user_attrs.get("worker") or {}).get("pid")
                if t.state.name == "RUNNING" and pid in by_pid and "model_config" in t.user_attrs:
                    victim, killed = by_pid[pid], t.number
                    break
            else:
                time.sleep(0.1)
        os.kill(victim.pid, signal.SIGKILL)
        survivors = [p for p in procs if p is not victim]
        for p in survivors:
            assert p.wait(timeout=DEADLINE_S) == 0, (tmp_path / f"worker{procs.index(p)}.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    trials = trials_of(storage_url, study)
    states = [t.state.name for t in trials]
    assert states.count("COMPLETE") == TOTAL, states
    assert "RUNNING" not in states and "WAITING" not in states, states
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) and sorted(numbers) == list(range(len(trials)))
    assert sum(bool(t.user_attrs.get("reference")) and t.number == 0 for t in trials) == 1
    dead = next(t for t in trials if t.number == killed)
    assert dead.state.name == "FAIL" and dead.user_attrs["worker"]["pid"] == victim.pid
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert len(retries) == 1, "the killed trial's parameters are retried exactly once"
    retry = retries[0]
    assert retry.number > killed and retry.params == dead.params and retry.state.name == "COMPLETE"
    assert retry.user_attrs["retry_of"] == killed and retry.user_attrs["worker"]["pid"] != victim.pid
    # Whatever else ended early was a surplus start (two workers at once), never a completed extra trial.
    for t in trials:
        if t.state.name == "PRUNED":
            assert t.user_attrs["pruned"].startswith("surplus"), t.user_attrs
        elif t.state.name == "FAIL":
            assert t.number == killed, t.user_attrs
