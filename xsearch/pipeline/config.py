"""``pipeline.yaml``: the schema of ``xsearch run``, its embedded default, and validation.

Each section of the file *is* one of the library's settings dataclasses (``search:`` is
``SearchSettings`` without what the pipeline sets itself, ``train:`` is ``TrainSettings``,
``compress:`` is ``CompressSettings`` plus the teacher, ...), so an option is defined once, in the
library, and validated by the same rules everywhere. The default file (``DEFAULT_YAML``, printed
by ``xsearch run --print-config``) is written from those dataclasses: their fields, their help as
comments, the library's defaults with the pipeline's own choices over them (``PIPELINE_DEFAULTS``).
A user's file only states what it changes and is merged over it; every key is checked before any
work starts, and a typo or a bad value fails at once with the key's dotted name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from xsearch.compress.settings import CompressSettings
from xsearch.errors import MissingPathError, SettingError, XSearchError
from xsearch.export.settings import ExportSettings
from xsearch.search.settings import PickSettings, SearchSettings
from xsearch.settings import Settings, did_you_mean, from_mapping, option, same_as, yaml_lines, yaml_scalar
from xsearch.supernet.settings import SupernetTrainSettings
from xsearch.training.settings import PretrainSettings, TrainSettings

TEACHERS = ("reference", "searched", "none")
SEARCH_MODES = ("standalone", "supernet")


class PipelineConfigError(XSearchError):
    """A pipeline.yaml that does not fit the schema (the message names the key)."""


@dataclass
class RunSettings(Settings):
    """The top-level keys: the run folder, and where the models are measured and deployed."""

    name: str = option("default", "the run folder is <runs_dir>/<name>")
    runs_dir: str = option("runs", "where run folders live")
    target: str = same_as(SearchSettings, "target", help="where latency is measured and the model will run")
    threads: int = same_as(SearchSettings, "threads", help="threads for latency measurement (and the deployed model)")
    batch: int = same_as(SearchSettings, "batch")

    def rules(self) -> None:
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise SettingError("name", f"{{0}}={self.name!r}: must be a plain folder name")


def _task_names() -> list[str]:
    from xsearch.tasks import list_tasks

    return list_tasks()


@dataclass
class TaskSection(Settings):
    """The task, by name, with its options (checked without generating or reading any data)."""

    name: str = option("listops", "listops | pathfinder | text | lm", choices=_task_names)
    options: dict[str, Any] = option(factory=dict, help="passed to the task: e.g. data: train.jsonl (text)")

    def rules(self) -> None:
        from xsearch.tasks import check_task_options

        try:
            check_task_options(self.name, self.options)
        except XSearchError as e:
            raise SettingError("options", "{0}: " + str(e).replace("{", "{{").replace("}", "}}")) from None


@dataclass
class SearchSection(SearchSettings):
    """``SearchSettings`` and how trials are scored."""

    mode: str = option("standalone", "standalone: each trial trains its candidate | supernet: a supernet is "
                       "trained once (the supernet: section) and trials are scored with its weights",
                       choices=SEARCH_MODES)  # fmt: skip
    SUPERNET_FIELD: ClassVar[tuple[str, str]] = ("mode", "{1} 'supernet'")

    def scored_by_supernet(self) -> bool:
        return self.mode == "supernet"

    def check_no_training_budget(self) -> None:
        """The section holds both modes' settings (as the file holds a ``supernet:`` section in standalone
        mode): ``train_steps`` / ``train_seconds`` are standalone mode's, and supernet mode leaves them be."""


@dataclass
class CompressSection(CompressSettings):
    """``CompressSettings`` and the model the pruned one is distilled from."""

    teacher: str = option("reference", "distil from: reference | searched (the unpruned model) | none",
                          choices=TEACHERS)  # fmt: skip


@dataclass
class PretrainSection(PretrainSettings):
    """``PretrainSettings`` and whether the run pretrains the picked model and the reference (each with this
    budget) before their full training."""

    enabled: bool = option(False, "self-pretrain the picked model and the reference (masked-token denoising on "
                           "the task's train inputs) before the train and reference stages")  # fmt: skip


@dataclass
class VerifySettings(Settings):
    """The last check: every ONNX file scored on the test split and timed, interleaved with the others."""

    latency_repeats: int = option(30, "timed runs per model, interleaved between the models compared", ge=1)


#: Fields of ``SearchSettings`` the pipeline sets itself (from the top level and the run folder).
SEARCH_FIXED = ("task", "task_options", "target", "threads", "batch", "storage", "study", "latency_cache",
                "heartbeat_interval", "grace_period", "supernet")  # fmt: skip
#: YAML key -> (its settings class, the fields it leaves out).
SECTIONS: dict[str, tuple[type, tuple[str, ...]]] = {
    "task": (TaskSection, ()),
    "search": (SearchSection, SEARCH_FIXED),
    "supernet": (SupernetTrainSettings, ()),
    "pick": (PickSettings, ()),
    "pretrain": (PretrainSection, ()),
    "train": (TrainSettings, ()),
    "compress": (CompressSection, ()),
    "export": (ExportSettings, ("check",)),  # every export is parity-checked
    "verify": (VerifySettings, ()),
}
#: The embedded default run: the library's defaults, with these over them (about 3 minutes on 2 cores).
PIPELINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "task": {"name": "listops", "options": {"n_train": 4000, "n_valid": 500, "n_test": 500, "max_len": 256}},
    "search": {"space": "tiny", "trials": 8, "train_steps": 150, "lr": 0.002},
    "supernet": {"steps": 2000, "lr": 0.002},
    "pretrain": {"steps": 600, "lr": 0.002},
    "train": {"steps": 600, "lr": 0.002, "keep_best": True},
    "compress": {"prune_ffn": 0.5, "finetune_steps": 200, "lr": 0.001, "keep_best": True},
    "export": {"quantize": "dynamic-int8"},
}
HEADER = """\
# xsearch run: search -> report -> pick -> [pretrain ->] train -> reference -> compress -> export -> quantize
# -> verify -> summary
# Every stage writes into runs/<name>/NN-<stage>; re-running the same command continues after the last
# finished stage. Give only the keys you change; the rest come from here. Budgets are in steps (seconds
# depend on how busy the machine is): give either steps or seconds, the other null.
"""


def default_yaml() -> str:
    """The commented default pipeline.yaml, written from the settings dataclasses."""
    lines = HEADER.splitlines()
    lines += yaml_lines(RunSettings, indent=0)
    for key, (cls, exclude) in SECTIONS.items():
        lines.append("")
        lines.append(f"{key}:")
        values = PIPELINE_DEFAULTS.get(key, {})
        if key == "task":
            rows = yaml_lines(cls, values, exclude=("options",))
            options = dataclasses.fields(cls)[1]
            rows.append(f"  options:  # {options.metadata['help']}")
            rows += [f"    {k}: {yaml_scalar(v)}" for k, v in values["options"].items()]
            lines += rows
        else:
            lines += yaml_lines(cls, values, exclude=exclude)
    return "\n".join(lines) + "\n"


def default_dict() -> dict[str, Any]:
    return yaml.safe_load(DEFAULT_YAML)


@dataclass
class PipelineConfig:
    """A whole ``xsearch run``, as validated data: the run's top-level settings and one settings object per
    section (``search`` is a complete ``SearchSettings``, its storage pointing at the run folder's study)."""

    name: str
    runs_dir: str
    target: str
    threads: int
    batch: int
    task: TaskSection
    search: SearchSection
    supernet: SupernetTrainSettings
    pick: PickSettings
    pretrain: PretrainSection
    train: TrainSettings
    compress: CompressSection
    export: ExportSettings
    verify: VerifySettings

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        """What the file says: the top-level keys and each section's own fields."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(RunSettings)}
        for key, (_, exclude) in SECTIONS.items():
            section = getattr(self, key)
            out[key] = {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.name not in exclude}
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def over_defaults(user: dict[str, Any], source: str) -> dict[str, Any]:
    """``user``'s keys merged over the default configuration (keys a newer xsearch added keep their default)."""
    data = default_dict()
    _merge(data, user, source)
    return data


def load_pipeline_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, *, name: str | None = None
) -> PipelineConfig:
    """The default configuration, with ``path``'s keys and then ``overrides`` (dotted keys) merged over it."""
    data = default_dict()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise MissingPathError(f"no such pipeline config: {path}")
        try:
            user = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise PipelineConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
        except UnicodeDecodeError as e:
            raise PipelineConfigError(f"{path}: not UTF-8 text ({e})") from None
        if user is None:
            user = {}
        if not isinstance(user, dict):
            raise PipelineConfigError(f"{path}: expected a mapping of keys at the top, got {type(user).__name__}")
        data = over_defaults(user, str(path))
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    if name is not None:
        data["name"] = name
    return validate(data, str(path) if path is not None else "pipeline config")


def _merge(base: dict[str, Any], user: dict[str, Any], source: str) -> None:
    for key, value in user.items():
        if key not in base:
            raise PipelineConfigError(f"{source}: unknown key {key!r}{did_you_mean(str(key), base)}")
        if key not in SECTIONS:
            base[key] = value
            continue
        if not isinstance(value, dict):
            raise PipelineConfigError(f"{source}: {key} must be a mapping, got {value!r}")
        for inner, v in value.items():
            if inner not in base[key]:
                raise PipelineConfigError(f"{source}: unknown key {f'{key}.{inner}'!r}"
                                          f"{did_you_mean(str(inner), base[key])}")  # fmt: skip
            base[key][inner] = dict(v) if inner == "options" else v  # task options replace the default's
        _drop_alternatives(base, key, value)


def _drop_alternatives(data: dict[str, Any], section: str, given: dict[str, Any]) -> None:
    """A budget given as one of a pair of alternatives (steps or seconds) replaces the default's other one.

    Given both, both stay, and the settings say to give one.
    """
    for group in getattr(SECTIONS[section][0], "ALTERNATIVES", ()):
        named = [k for k in group if given.get(k) is not None]
        if len(named) == 1:
            for other in group:
                if other != named[0] and other not in given:
                    data[section][other] = None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if len(parts) == 1:
        if parts[0] not in data or parts[0] in SECTIONS:
            raise PipelineConfigError(f"--set: unknown key {dotted!r}{did_you_mean(parts[0], data)}")
        data[parts[0]] = value
        return
    section, key = parts[0], parts[1]
    if section not in SECTIONS:
        raise PipelineConfigError(f"--set: unknown key {section!r}{did_you_mean(section, SECTIONS)}")
    if key not in data[section]:
        raise PipelineConfigError(f"--set: unknown key {dotted!r}{did_you_mean(key, data[section])}")
    if section == "task" and key == "options" and len(parts) > 2:
        data["task"]["options"][".".join(parts[2:])] = value
    elif len(parts) > 2:
        raise PipelineConfigError(f"--set: unknown key {dotted!r}")
    else:
        data[section][key] = value
        _drop_alternatives(data, section, {key: value})


def validate(data: dict[str, Any], source: str = "pipeline config") -> PipelineConfig:
    """Check ``data`` (a merged configuration) against the settings dataclasses; returns the config."""
    where = f"{source}: "
    top = {k: v for k, v in data.items() if k not in SECTIONS}
    try:
        run = from_mapping(RunSettings, top, source=where)
        sections = {}
        for key in ("task", "supernet", "pick", "pretrain", "train", "compress", "export", "verify"):
            cls, exclude = SECTIONS[key]
            sections[key] = from_mapping(cls, data.get(key, {}), exclude=exclude, source=where,
                                         name=lambda f, key=key: f"{key}.{f}")  # fmt: skip
        task = sections["task"]
        fixed = {"task": task.name, "task_options": task.options, "target": run.target, "threads": run.threads,
                 "batch": run.batch, "study": "search"}  # fmt: skip
        top_name = {"target": "target", "threads": "threads", "batch": "batch", "task": "task.name",
                    "task_options": "task.options"}  # fmt: skip
        sections["search"] = from_mapping(SearchSection, data.get("search", {}), fixed=fixed, exclude=SEARCH_FIXED,
                                          source=where, name=lambda f: top_name.get(f, f"search.{f}"))  # fmt: skip
    except SettingError as e:
        raise PipelineConfigError(str(e)) from None
    return PipelineConfig(**{f.name: getattr(run, f.name) for f in dataclasses.fields(RunSettings)}, **sections)


DEFAULT_YAML = default_yaml()
