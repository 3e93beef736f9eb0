"""The settings dataclasses: one definition per option, checked on construction, named by each front end."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from xsearch.cli.args import Parser, UsageError, add_settings, settings_from_args
from xsearch.errors import SettingError, XSearchError
from xsearch.settings import (
    Settings,
    differing_keys,
    from_mapping,
    option,
    parse_assignments,
    parse_value,
    show_differences,
    yaml_lines,
)


@dataclass
class Toy(Settings):
    steps: int | None = option(None, "optimizer steps", gt=0)
    seconds: float | None = option(None, "a time budget", gt=0)
    mode: str = option("fast", "how", choices=("fast", "slow"))
    ratio: float = option(0.5, "a fraction", ge=0, lt=1)
    keep: bool = option(False, "keep it")
    check: bool = option(True, "a field called like a method is fine")
    lengths: list[int] | None = option(None, "some lengths")

    def rules(self) -> None:
        if self.steps is not None and self.seconds is not None:
            raise SettingError(("steps", "seconds"), "give {0} or {1}, not both")


def test_fields_are_type_checked_bounded_and_their_choices_enforced():
    assert Toy(ratio=0).ratio == 0.0 and isinstance(Toy(ratio=0).ratio, float)  # an int where a float goes
    for kwargs, message in [
        ({"steps": 0}, "steps must be > 0, got 0"),
        ({"steps": "10"}, "steps must be an integer, got '10'"),
        ({"steps": True}, "steps must be an integer, got True"),  # a bool is not a number
        ({"ratio": 1.0}, "ratio must be < 1, got 1.0"),
        ({"mode": "warp"}, "mode must be one of fast, slow, got 'warp'"),
        ({"keep": "no"}, "keep must be true or false, got 'no'"),
        ({"lengths": [1, "x"]}, "lengths[1] must be an integer, got 'x'"),
        ({"mode": None}, "mode must be a string, got null"),
        ({"steps": 1, "seconds": 2.0}, "give steps or seconds, not both"),
    ]:
        with pytest.raises(SettingError) as e:
            Toy(**kwargs)
        assert str(e.value) == message
        assert isinstance(e.value, XSearchError) and isinstance(e.value, ValueError)


def test_an_error_names_its_fields_in_each_front_ends_words():
    with pytest.raises(SettingError) as e:
        Toy(steps=1, seconds=2.0)
    assert e.value.render(lambda f: "--" + f) == "give --steps or --seconds, not both"
    with pytest.raises(SettingError) as e:
        from_mapping(Toy, {"steps": 1, "seconds": 2.0}, name=lambda f: f"train.{f}", source="p.yaml: ")
    assert str(e.value) == "p.yaml: give train.steps or train.seconds, not both"
    with pytest.raises(SettingError, match=r"p.yaml: unknown key 'train.stepz' \(did you mean 'steps'\?\)"):
        from_mapping(Toy, {"stepz": 1}, name=lambda f: f"train.{f}", source="p.yaml: ")
    with pytest.raises(SettingError, match="unknown key 'mode'"):  # a field the caller sets itself
        from_mapping(Toy, {"mode": "slow"}, exclude=("mode",))
    assert from_mapping(Toy, {"steps": 3}, fixed={"mode": "slow"}) == Toy(steps=3, mode="slow")


def test_cli_flags_are_built_from_the_fields_and_errors_name_the_flag():
    p = Parser(prog="t")
    add_settings(p, Toy, defaults={"steps": 7})
    flags = {a.dest: a.option_strings for a in p._actions if a.dest != "help"}
    assert flags["steps"] == ["--steps"] and flags["lengths"] == ["--lengths"]
    assert flags["check"] == ["--check", "--no-check"]  # default True: it can be switched off
    assert Toy.__dataclass_fields__["keep"].default is False and flags["keep"] == ["--keep"]
    args = p.parse_args(["--seconds", "3", "--lengths", "256,512", "--no-check"])
    got = settings_from_args(Toy, args, defaults={"steps": None})
    assert (got.seconds, got.lengths, got.check, got.mode) == (3.0, [256, 512], False, "fast")
    assert settings_from_args(Toy, p.parse_args([]), defaults={"steps": 7}).steps == 7
    with pytest.raises(UsageError, match="give --steps or --seconds, not both"):
        settings_from_args(Toy, p.parse_args(["--steps", "2", "--seconds", "1"]))
    with pytest.raises(UsageError, match="--steps must be > 0, got -2"):
        settings_from_args(Toy, p.parse_args(["--steps", "-2"]))
    with pytest.raises(UsageError, match="invalid choice: 'warp'"):
        p.parse_args(["--mode", "warp"])
    assert "a time budget" in p.format_help() and "(default: 7)" in p.format_help()


def test_yaml_lines_write_defaults_with_their_help():
    lines = yaml_lines(Toy, {"steps": 5}, exclude=("lengths",))
    assert lines[0].startswith("  steps: 5") and lines[0].endswith("# optimizer steps")
    assert any(line.startswith("  seconds: null") for line in lines)
    assert not any("lengths" in line for line in lines)


def test_command_line_values_read_as_yaml_scalars():
    assert [parse_value(v) for v in ("64", "0.5", "true", "null", "abc", "[1, 2]")] == [64, 0.5, True, None, "abc",
                                                                                           "[1, 2]"]  # fmt: skip
    assert parse_assignments(["a=1", "b = x ", "c=null"], "--set") == {"a": 1, "b": "x", "c": None}
    with pytest.raises(SettingError, match="--set expects KEY=VALUE, got 'oops'"):
        parse_assignments(["oops"], "--set")


def test_every_settings_class_of_the_library_builds_with_its_defaults_and_has_help():
    from xsearch.compress.settings import AdapterSettings, CompressSettings
    from xsearch.export.serve import ServeSettings
    from xsearch.export.settings import ExportSettings
    from xsearch.latency.sweep import SweepSettings
    from xsearch.latency.timing import MeasureSettings
    from xsearch.pipeline.config import RunSettings, TaskSection, VerifySettings
    from xsearch.search.settings import PickSettings, SearchSettings
    from xsearch.training.settings import TrainSettings

    for cls, needed in [(SearchSettings, {}), (SweepSettings, {}), (TrainSettings, {"steps": 1}),
                        (CompressSettings, {}), (AdapterSettings, {}), (ExportSettings, {}), (ServeSettings, {}),
                        (PickSettings, {}), (MeasureSettings, {"seq_len": 8}), (RunSettings, {}), (TaskSection, {}),
                        (VerifySettings, {})]:  # fmt: skip
        cls(**needed)
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_differences_name_each_key_with_both_values():
    held, now = {"lr": 0.003, "steps": 10, "seed": 0, "old": 1}, {"lr": 0.001, "steps": 10, "seed": 0, "new": 2}
    assert differing_keys(held, now) == ["lr", "new", "old"]  # a key only one record has differs
    assert differing_keys(held, now, ("steps", "old", "lr")) == ["old", "lr"]  # the given keys, in their order
    assert show_differences(held, now) == "lr 0.003 there, 0.001 now; new None there, 2 now; old 1 there, None now"
    assert show_differences(held, now, ["lr"], held_as="in a", now_as="in b") == "lr 0.003 in a, 0.001 in b"
    assert show_differences(held, dict(held)) == ""  # the same records: nothing to show


def test_with_defaults_fills_only_the_options_a_record_predates():
    @dataclass
    class Recipe(Settings):
        lr: float = option(1e-3, "learning rate")
        warmup: int = option(0, "warmup steps")

    assert Recipe.with_defaults({"lr": 0.5}) == {"lr": 0.5, "warmup": 0}
    assert Recipe.with_defaults({"lr": 0.5, "warmup": 3}) == {"lr": 0.5, "warmup": 3}
