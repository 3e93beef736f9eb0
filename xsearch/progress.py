"""Progress of a study: one line per trial this process finishes, above a bar of the study's COMPLETE trials.

Shared by the search and the latency sweep; each says what its line holds (``line``).
"""

from __future__ import annotations

import logging

import optuna

log = logging.getLogger("xsearch")


def complete_trials(study: optuna.Study) -> int:
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))


class StudyProgress:
    """An Optuna callback: ``line(trial)`` printed above a progress bar (or logged, without a terminal).

    Use as a context manager around the study's work; call it (or ``emit``) after each trial.
    """

    def __init__(self, study: optuna.Study, total: int, show: bool, label: str) -> None:
        self.total, self.show, self.label = total, show, label
        self.progress = None
        self.task_id = None
        self.complete = complete_trials(study)

    def __enter__(self):
        if self.show and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            self.progress.__enter__()
            self.task_id = self.progress.add_task(self.label, total=self.total, completed=self.complete)
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def line(self, trial: optuna.trial.FrozenTrial) -> str:
        """The line shown for a finished trial (override)."""
        why = trial.user_attrs.get("pruned") or trial.user_attrs.get("error", "")
        return f"trial {trial.number:3d}: {trial.state.name} {why[:160]}"

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.emit(self.line(trial), study)

    def emit(self, line: str, study: optuna.Study) -> None:
        """Print one line above the progress bar (or log it) and advance the bar."""
        if self.progress is not None:
            self.progress.console.print(line, soft_wrap=True, markup=False, highlight=False)
            done = complete_trials(study)
            self.progress.update(self.task_id, completed=min(done, self.total))
        else:
            log.info(line)
