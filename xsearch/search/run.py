"""``run_search``: run, resume or join a search until its study holds the requested COMPLETE trials."""

from __future__ import annotations

import logging
from dataclasses import asdict

import optuna

from xsearch.errors import XSearchError
from xsearch.search.objective import Objective
from xsearch.search.progress import SearchProgress
from xsearch.search.settings import SearchSettings
from xsearch.search.study import CHANCE_KIND, LOSS_METRIC, metric_name, open_study, search_metric
from xsearch.search.workers import count_states, run_until_total

log = logging.getLogger("xsearch.search")


class FailureGuard:
    """Stops a worker whose trials keep failing for the same reason (a broken setting, a missing device):
    ``max_failures`` of its trials in a row FAIL with the same error."""

    def __init__(self, study: optuna.Study, objective: Objective, max_failures: int) -> None:
        self.study, self.objective, self.max_failures = study, objective, max_failures
        self.errors: list[tuple[str, bool]] = []

    def __call__(self) -> None:
        number = self.objective.current
        mine = [t for t in self.study.get_trials(deepcopy=False) if t.number == number]
        if not mine:
            return
        t = mine[0]
        if t.state != optuna.trial.TrialState.FAIL or "error" not in t.user_attrs:
            self.errors.clear()
            return
        self.errors.append((t.user_attrs["error"], bool(t.user_attrs.get("error_is_user"))))
        last = self.errors[-self.max_failures :]
        if len(last) == self.max_failures and len({e for e, _ in last}) == 1:
            reason, user = last[0]
            message = f"search stopped: {len(last)} trials in a row failed with {reason}"
            raise XSearchError(message) if user else RuntimeError(message)


def run_search(settings: SearchSettings, *, progress: bool = True) -> optuna.Study:
    """Run (or resume, or join) the study until it holds ``settings.trials`` COMPLETE trials; returns it.

    Several processes may call this at once on one storage and study: together they end with exactly
    ``settings.trials`` COMPLETE trials (see ``xsearch.search.workers``). Everything that can be checked
    before work is checked first: the space, the task's options and the storage (a database that cannot be
    reached fails before the task is built).

    Raises:
        XSearchError: bad settings, space, task options or storage; or trials that keep failing for a
            reason the user can fix (``max_failures`` in a row).
        RuntimeError: trials that keep failing for another reason.
    """
    from xsearch.latency.cache import LatencyCache, default_cache_path
    from xsearch.search_spaces import load_space, load_space_for_task
    from xsearch.storage import open_storage
    from xsearch.tasks import check_task_options, get_task

    # Errors only: a failed trial is one line of the search's own (its reason in user_attrs["error"]), not
    # Optuna's warning with a whole traceback per trial.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    from xsearch.training.device import resolve_device

    load_space(settings.space)
    check_task_options(settings.task, settings.task_options)
    if settings.supernet is None:
        resolve_device(settings.train_device)  # a GPU that is not there fails here, not in every trial
    open_storage(settings.storage)  # reachable, before the (slower) task is built
    task = get_task(settings.task, **settings.task_options)
    space = load_space_for_task(settings.space, task)
    cache_path = default_cache_path() if settings.latency_cache == "default" else settings.latency_cache
    supernet = None
    if settings.supernet is not None:
        from xsearch.supernet import load_supernet
        from xsearch.supernet.io import check_matches

        supernet = load_supernet(settings.supernet)
        check_matches(
            supernet.space.to_yaml(), supernet.task_fields, space, task.model_fields(), where=settings.supernet
        )
    objective = Objective(settings, task, space, LatencyCache(cache_path), supernet=supernet)
    study = open_study(settings, task.kind, reference_params=space.reference_params())
    metric = search_metric(settings, task.kind)
    chances = {metric_name(task.kind): {split: task.chance(split) for split in ("valid", "test")}}
    if task.kind != "lm":
        chances[LOSS_METRIC] = {split: task.loss_chance(split) for split in ("valid", "test")}
    chance = chances[metric]
    study.set_user_attr("settings", {k: v for k, v in asdict(settings).items() if k != "storage"})
    study.set_user_attr("task", task.describe() | {"options": settings.task_options})
    study.set_user_attr("metric", metric)
    study.set_user_attr("chance", chance)
    study.set_user_attr("chances", chances)
    study.set_user_attr("space", space.name)
    complete = count_states(study)[optuna.trial.TrialState.COMPLETE]
    if complete >= settings.trials:
        log.info("study %r already has %d COMPLETE trials (--trials %d is its total): nothing to add",
                 settings.study, complete, settings.trials)  # fmt: skip
        return study
    log.info("chance level on the validation split: %s",
             ", ".join(f"{name} {c['valid']:.4f} ({CHANCE_KIND[name]})" for name, c in chances.items()))  # fmt: skip
    guard = FailureGuard(study, objective, settings.max_failures)
    with SearchProgress(study, settings.trials, progress, metric) as reporter:
        run_until_total(
            study, objective, total=settings.trials, heartbeat=True, timeout=settings.timeout, callbacks=[reporter],
            poll_s=max(0.2, min(2.0, settings.heartbeat_interval / 2)), current_trial=lambda: objective.current,
            after_trial=guard, collect_garbage=supernet is None,
        )  # fmt: skip
    return study
