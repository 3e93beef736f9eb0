"""Samplers and pruners of a search: which candidate a trial draws, and which trials stop early."""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from xsearch.search.settings import REPORTS_PER_TRIAL, SearchSettings


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        with warnings.catch_warnings():  # multivariate/group are "experimental" but suit conditional spaces
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True,
                n_startup_trials=max(2, min(10, trials // 3)),
            )  # fmt: skip
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 3)))
    return optuna.samplers.RandomSampler(seed=seed)


def report_every(settings: SearchSettings) -> int | None:
    """Training steps between validation reports when a pruner watches training (None: time-based)."""
    steps = settings.trial_steps()
    return None if steps is None else max(1, steps // REPORTS_PER_TRIAL)


def make_pruner(settings: SearchSettings) -> optuna.pruners.BasePruner:
    """The pruner of an ``objective="accuracy"`` study; its resources are training steps (none when no trial
    trains: a supernet search scoring inherited weights)."""
    if settings.trial_steps() == 0:
        return optuna.pruners.NopPruner()
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=min(5, max(1, settings.trials // 5)), n_warmup_steps=0)
    if settings.pruner == "hyperband":
        every = report_every(settings)
        if every is None:  # a time budget: steps per trial are learnt from the first finished trial
            return optuna.pruners.HyperbandPruner(min_resource=1, max_resource="auto", reduction_factor=3)
        return optuna.pruners.HyperbandPruner(
            min_resource=every, max_resource=settings.trial_steps(), reduction_factor=3
        )
    return optuna.pruners.NopPruner()


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s sampler in a study searched with ``seed`` (distinct seeds: unrelated streams)."""
    return (seed * 1_000_003 + number) % 2**32


class PerTrialSampler(optuna.samplers.BaseSampler):
    """Trial 0 samples the reference Transformer; every other trial a fresh base sampler seeded with its number.

    Trial numbers are unique, so however many workers start on an empty study at once, exactly one trial is
    the reference (an ``enqueue_trial`` by each of them would queue it several times); and workers that share
    a seed still draw different candidates, while one worker's study stays reproducible. The base samplers
    keep no state between trials beyond their random generator: they read the history from the storage.
    """

    def __init__(self, make_base, reference: dict[str, Any] | None = None) -> None:
        """``make_base(trial_number)`` builds the sampler of one trial; ``reference``: trial 0's parameters."""
        self.make_base, self.reference = make_base, reference or {}
        self._bases: dict[int, optuna.samplers.BaseSampler] = {}  # trials asked and not yet told

    def _base(self, trial) -> optuna.samplers.BaseSampler:
        if trial.number not in self._bases:
            self._bases[trial.number] = self.make_base(trial.number)
        return self._bases[trial.number]

    def before_trial(self, study, trial) -> None:
        self._base(trial).before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return {} if self._is_reference(trial) else self._base(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return {} if self._is_reference(trial) else self._base(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        if self._is_reference(trial) and param_name in self.reference:
            return self.reference[param_name]
        return self._base(trial).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._base(trial).after_trial(study, trial, state, values)
        self._bases.pop(trial.number, None)

    def reseed_rng(self) -> None:
        for base in self._bases.values():
            base.reseed_rng()

    def _is_reference(self, trial) -> bool:
        return trial.number == 0 and bool(self.reference)
