"""One trial of a search: suggest -> build -> budgets -> latency -> train -> validate."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from typing import Any

import optuna

from xsearch.errors import XSearchError
from xsearch.search.sampling import report_every
from xsearch.search.settings import SearchSettings
from xsearch.search.study import LOSS_METRIC, constraints, metric_name, search_metric
from xsearch.search.workers import SURPLUS, within_total

log = logging.getLogger("xsearch.search")

#: ``user_attrs`` a duplicate copies from the trial it repeats (with ``duplicate_of`` naming it).
COPIED_ATTRS = (
    "n_parameters",
    "latency",
    "device",
    "latency_predicted_ms",
    "accuracy",
    "bits_per_byte",
    LOSS_METRIC,
    "pruned",
)


def constrain(trial: optuna.Trial, name: str, value: float) -> None:
    """An Optuna constraint (``<= 0``: met), mirrored in ``user_attrs["constraints"]``: optuna-dashboard shows
    user attributes, not the constraint keys Optuna 5 stores."""
    trial.set_constraint(name, value)
    shown = dict(trial.user_attrs.get("constraints") or {})
    shown[name] = value
    trial.set_user_attr("constraints", shown)


def as_stored(config: dict[str, Any]) -> dict[str, Any]:
    """A ``ModelConfig`` dict as the storage gives it back (JSON types), so configs compare with ``==``."""
    return json.loads(json.dumps(config))


class Objective:
    """One trial: suggest -> (a repeat of a finished trial? reuse it) -> build -> check the size budget ->
    measure latency -> check the latency budget -> train (reporting to the pruner) -> validate.

    With ``objective="both"`` a trial returns ``(metric, latency_ms)`` and budgets are constraints; with
    ``objective="accuracy"`` it returns the metric and an over-budget trial is pruned before training.
    A candidate identical to a finished trial (same ``model_config``) is not trained again: it returns
    that trial's result, recorded as ``duplicate_of``, so the sampler still learns from the point.
    """

    def __init__(self, settings: SearchSettings, task, space, cache, *, supernet=None) -> None:
        self.s = settings
        self.supernet = supernet  # a SuperTransformer: trials are scored with its weights, untrained
        self.task = task
        self.space = space
        self.cache = cache
        self.single = settings.objective == "accuracy"
        self.metric = search_metric(settings, task.kind)  # what a trial returns (and reports to the pruner)
        self.current: int | None = None  # the number of the trial this worker runs now (or ran last)
        self.reference = False  # whether that trial is the reference (never pruned: the baseline of the report)
        self.seq_len = settings.seq_len or task.max_len
        if self.seq_len > task.max_len:
            raise XSearchError(f"seq_len {self.seq_len} exceeds the task's max_len={task.max_len}")
        if settings.latency_mode != "forward" and task.kind != "lm":
            raise XSearchError(f"latency mode {settings.latency_mode!r} times a decoder: it needs the lm task, "
                               f"not {task.name!r}")  # fmt: skip
        # decode: the step that makes token seq_len, unless a context is given
        self.context = (settings.context or max(1, self.seq_len - 1)) if settings.latency_mode == "decode" else None
        if self.context is not None and self.context + 1 > task.max_len:
            raise XSearchError(f"context {self.context} plus the timed token exceeds the task's max_len={task.max_len}")
        self.predictor = None
        if settings.latency_predictor is not None:
            from xsearch.latency.predictor import load_for_target

            self.predictor = load_for_target(settings.latency_predictor, settings.target, settings.threads)

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        self.current = trial.number
        trials = trial.study.get_trials(deepcopy=False)
        if not within_total(trials, trial.number, self.s.trials):
            self._prune(trial, f"{SURPLUS}: the study already has {self.s.trials} trials complete or under way")
        trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": os.getpid()})
        me = next((t for t in trials if t.number == trial.number), None)
        self.reference = trial.number == 0 or bool(me and me.user_attrs.get("reference"))  # (a retry copies attrs)
        if trial.number == 0:
            trial.set_user_attr("reference", True)
        retry_of = me.system_attrs.get("failed_trial") if me else None
        if retry_of is not None:  # queued again by the heartbeat check after its worker died
            trial.set_user_attr("retry_of", retry_of)
        try:
            return self._run(trial, trials)
        except optuna.TrialPruned:
            raise
        except Exception as e:
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:2000])
            trial.set_user_attr("error_is_user", isinstance(e, XSearchError))
            log.debug("trial %d failed", trial.number, exc_info=True)  # (-v shows where)
            raise

    def _run(self, trial: optuna.Trial, trials) -> float | tuple[float, float]:
        import torch

        from xsearch.model import build_model, count_parameters

        cfg = self.space.suggest(trial, self.task.model_fields())
        config = cfg.to_dict()
        trial.set_user_attr("model_config", config)
        trial.set_user_attr("params", dict(trial.params))
        earlier = self._finished_twin(trials, trial.number, config)
        if earlier is not None:
            return self._repeat(trial, earlier)
        predicted_ms = self._screen_latency(trial, cfg)
        torch.manual_seed(self.s.seed + trial.number)
        if self.supernet is not None:
            from xsearch.supernet import extract_subnet

            model = extract_subnet(self.supernet, cfg)
        else:
            model = build_model(cfg)
        n_params = count_parameters(model)
        trial.set_user_attr("n_parameters", n_params)
        if self.s.max_params is not None:
            self._budget(trial, "params", n_params, self.s.max_params, f"{n_params} parameters")
        if self.supernet is not None and predicted_ms is not None:
            latency_ms = predicted_ms  # (scoring takes a fraction of a second: measuring would dominate)
            trial.set_user_attr("latency", {"median_ms": latency_ms, "predicted": True})
        else:
            latency_ms = self._latency(trial, cfg, model)
        if self.s.max_latency_ms is not None:
            self._budget(trial, "latency", latency_ms, self.s.max_latency_ms, f"latency {latency_ms:.2f} ms")
        if self.supernet is not None:
            trial.set_user_attr("inherited_from", str(self.s.supernet))
        metric = self._inherited(trial, model) if self.s.trial_steps() == 0 else self._train(trial, model)
        return metric if self.single else (metric, latency_ms)

    def _inherited(self, trial: optuna.Trial, model) -> float:
        """The validation score of the subnet with the supernet's weights (no training)."""
        from xsearch.training import evaluate_score

        start = time.perf_counter()
        score = evaluate_score(model, self.task, "valid")
        trial.set_user_attr("train_steps", 0)
        trial.set_user_attr("train_seconds", 0.0)
        trial.set_user_attr("score_seconds", round(time.perf_counter() - start, 3))
        return self._scored(trial, score)

    def _scored(self, trial: optuna.Trial, score) -> float:
        """Record a validation :class:`~xsearch.training.Score` in the trial; return what the trial is ranked by."""
        trial.set_user_attr(metric_name(self.task.kind), score.metric)
        if self.task.kind != "lm":
            trial.set_user_attr(LOSS_METRIC, score.loss)
        value = score.loss if self.metric == LOSS_METRIC else score.metric
        if not math.isfinite(value):
            raise RuntimeError(f"validation {self.metric} is {value}")
        return value

    @staticmethod
    def _finished_twin(trials, number: int, config: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
        """The first finished trial with the same architecture: COMPLETE, or PRUNED for being over a budget."""
        config = as_stored(config)
        for t in trials:
            if t.number == number or t.user_attrs.get("model_config") is None:
                continue
            done = t.state == optuna.trial.TrialState.COMPLETE or (
                t.state == optuna.trial.TrialState.PRUNED and str(t.user_attrs.get("pruned", "")).startswith("over")
            )
            if done and t.user_attrs["model_config"] == config:
                return t
        return None

    def _repeat(self, trial: optuna.Trial, earlier: optuna.trial.FrozenTrial) -> float | tuple[float, float]:
        """Give ``trial`` the result of the finished trial ``earlier`` of the same architecture (no training)."""
        origin = earlier.user_attrs.get("duplicate_of", earlier.number)
        trial.set_user_attr("duplicate_of", origin)
        trial.set_user_attr("latency_cached", True)
        trial.set_user_attr("train_steps", 0)
        trial.set_user_attr("train_seconds", 0.0)
        for key in COPIED_ATTRS:
            if key in earlier.user_attrs:
                trial.set_user_attr(key, earlier.user_attrs[key])
        for name, value in constraints(earlier).items():
            constrain(trial, name, value)
        if earlier.state == optuna.trial.TrialState.PRUNED:
            raise optuna.TrialPruned(earlier.user_attrs.get("pruned", "over budget"))
        return earlier.values[0] if self.single else tuple(earlier.values)

    def _screen_latency(self, trial: optuna.Trial, cfg) -> float | None:
        """Record the predicted latency (returned; None without a predictor); prune the trial, unbuilt and
        untrained, when it is over the budget."""
        if self.predictor is None:
            return None
        predicted = self.predictor.predict(cfg, self.seq_len, self.s.batch)
        trial.set_user_attr("latency_predicted_ms", predicted)
        budget = self.s.max_latency_ms
        if budget is not None and predicted > budget and not self.reference:
            if not self.single:
                constrain(trial, "latency", predicted - budget)  # so the sampler counts it as infeasible
            self._prune(trial, f"over budget: predicted latency {predicted:.2f} ms > {budget:g} ms")
        return predicted

    def _latency(self, trial: optuna.Trial, cfg, model) -> float:
        """Measure (or read from the cache) the model's latency on the target; record it; return the median."""
        from xsearch.latency.cache import cache_key
        from xsearch.latency.timing import device_fingerprint, measure

        device = device_fingerprint(self.s.target, self.s.threads)
        mode = self.s.latency_mode
        key = cache_key(cfg.to_dict(), self.s.target, self.s.batch, self.seq_len, device, mode, self.context)
        stats = self.cache.get(key)
        cached = stats is not None
        if stats is None:
            stats = measure(model, self.s.target, batch=self.s.batch, seq_len=self.seq_len, threads=self.s.threads,
                            repeats=self.s.latency_repeats, mode=mode, context=self.context)  # fmt: skip
            self.cache.put(key, stats)
        trial.set_user_attr("latency", stats.to_dict())
        trial.set_user_attr("latency_cached", cached)
        trial.set_user_attr("device", stats.device)
        return stats.median_ms

    def _budget(self, trial: optuna.Trial, name: str, value: float, limit: float, what: str) -> None:
        """A budget: an Optuna constraint (two objectives, and the reference), else pruning before training."""
        if not self.single or self.reference:
            constrain(trial, name, value - limit)
        elif value > limit:
            trial.set_user_attr("train_steps", 0)
            self._prune(trial, f"over budget: {what} > {limit:g}")

    def _prune(self, trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr("pruned", reason)
        raise optuna.TrialPruned(reason)

    def _train(self, trial: optuna.Trial, model) -> float:
        """Train within the per-trial budget (from the supernet's weights when it fine-tunes them); a
        single-objective study reports validation to its pruner."""
        from xsearch.training import evaluate_score, train
        from xsearch.training.device import moved_to, resolve_device

        start = time.perf_counter()
        reported = "valid_loss" if self.metric == LOSS_METRIC else "valid"  # the key of train()'s records

        def report(step: int, record: dict[str, Any]) -> None:
            trial.report(record[reported], step)
            if not self.reference and trial.should_prune():
                trial.set_user_attr("train_steps", step)
                trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 2))
                self._prune(trial, f"stopped early at step {step}: {self.metric} {record[reported]:.4f}")

        with moved_to(model, resolve_device(self.s.train_device)):  # trained and validated there
            result = train(
                model, self.task, steps=self.s.trial_steps(), seconds=self.s.trial_seconds(),
                batch_size=self.s.batch_size, lr=self.s.lr, seed=self.s.seed + trial.number, progress=False,
                eval_every=report_every(self.s) if self.single else None, callback=report if self.single else None,
            )  # fmt: skip
            score = evaluate_score(model, self.task, "valid")
        trial.set_user_attr("train_seconds", round(result.seconds, 2))
        trial.set_user_attr("train_steps", result.steps)
        return self._scored(trial, score)
