"""Many workers on one study: ``--trials`` is the study's total, reached exactly.

Any number of processes, on any number of machines, may run the same search on one storage. Each
worker starts a trial only while the study has fewer than ``total`` COMPLETE plus RUNNING trials, and
each trial, as it starts, counts the lower-numbered trials that are COMPLETE, RUNNING or WAITING: when
they already make up the total (two workers started at once), it ends itself as PRUNED, marked
``surplus``, before any work. A trial that ends COMPLETE had fewer than ``total`` such trials before it
and every COMPLETE trial numbered below it was among them, so no study ends with more than ``total``
COMPLETE trials. Workers stop only when the study holds ``total`` COMPLETE trials: while trials run
elsewhere that could still fail (a killed worker's trial is failed by the heartbeat check and queued
again), they wait and look again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime

import optuna
from optuna.trial import TrialState

log = logging.getLogger("xsearch.search")

ALIVE = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
SURPLUS = "surplus"


def count_states(study: optuna.Study) -> Counter:
    """Trials of the study per state (``Counter`` keyed by ``TrialState``)."""
    return Counter(t.state for t in study.get_trials(deepcopy=False))


def within_total(trials: Sequence[optuna.trial.FrozenTrial], number: int, total: int) -> bool:
    """Whether trial ``number`` may run: fewer than ``total`` lower-numbered ``trials`` are COMPLETE, RUNNING or
    WAITING (``trials``: the study's trials, read as the trial starts)."""
    return sum(1 for t in trials if t.number < number and t.state in ALIVE) < total


def fail_stale(study: optuna.Study, *, orphan_after_s: float = 300.0) -> None:
    """Fail running trials whose heartbeat stopped and queue their retry (storages with heartbeats).

    Also fails trials left RUNNING by a killed search from before heartbeats (no ``worker`` attribute,
    started more than ``orphan_after_s`` ago): nothing would ever end them, and they would hold a place in
    the study's total.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    now = datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if (
            "worker" not in t.user_attrs
            and t.datetime_start
            and (now - t.datetime_start).total_seconds() > orphan_after_s
        ):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError, ValueError):
                study.tell(t.number, state=TrialState.FAIL)
                log.warning("trial %d: left RUNNING by an earlier search without heartbeats; marked FAIL", t.number)


def run_until_total(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float | Sequence[float]],
    *,
    total: int,
    heartbeat: bool,
    timeout: float | None = None,
    callbacks: Sequence[Callable] = (),
    poll_s: float = 1.0,
    current_trial: Callable[[], int | None] = lambda: None,
    after_trial: Callable[[], None] = lambda: None,
    collect_garbage: bool = True,
) -> None:
    """Run trials until the study holds ``total`` COMPLETE trials (or ``timeout`` seconds have passed).

    Args:
        study: the shared study.
        objective: the trial function (it ends surplus trials itself, see ``within_total``).
        total: COMPLETE trials the study should end with.
        heartbeat: whether the storage records heartbeats; without them a worker cannot tell a trial
            running elsewhere from one whose worker died, so it stops instead of waiting for it.
        timeout: stop starting trials after this many seconds.
        callbacks: Optuna callbacks called after each trial this worker runs.
        poll_s: seconds between looks at the study while waiting for trials running elsewhere.
        current_trial: returns the number of the trial this worker last started (to recognise a trial that
            another worker failed as stale while this one was still running it).
        after_trial: called after each trial this worker runs; it may raise to stop the worker.
        collect_garbage: a full ``gc.collect()`` after each trial (frees a trained model's cycles at once; it
            walks every live object, 0.26 s per trial with 2,000 trials cached, which a trial that only scores
            a supernet's subnet does not need).
    """
    start = time.monotonic()
    waiting_said = False
    while True:
        if heartbeat:
            fail_stale(study)
        n = count_states(study)
        if n[TrialState.COMPLETE] >= total:
            return
        if timeout is not None and time.monotonic() - start >= timeout:
            log.info("timeout: %d of %d trials complete", n[TrialState.COMPLETE], total)
            return
        if n[TrialState.COMPLETE] + n[TrialState.RUNNING] >= total:
            if not heartbeat:
                log.info("%d trials still running elsewhere; stopping", n[TrialState.RUNNING])
                return
            if not waiting_said:
                log.info("waiting for %d trials running on other workers", n[TrialState.RUNNING])
                waiting_said = True
            time.sleep(poll_s)
            continue
        if waiting_said:
            # Room appeared while waiting: often a stale trial another worker has just failed, and whose retry
            # it is about to queue. Let the retry land first, so that it is the trial that runs.
            waiting_said = False
            time.sleep(poll_s)
            continue
        try:
            study.optimize(objective, n_trials=1, catch=(Exception,), callbacks=list(callbacks),
                           gc_after_trial=collect_garbage)  # fmt: skip
        except Exception:
            number = current_trial()
            mine = [t for t in study.get_trials(deepcopy=False) if t.number == number]
            if not mine or mine[0].state != TrialState.FAIL:
                raise
            # Optuna cannot record the result of a trial that is no longer RUNNING.
            log.warning("trial %d was failed by another worker (no heartbeat within the grace period)", number)
        after_trial()
