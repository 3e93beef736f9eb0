"""What an exported file carries: metadata keys and how they are read back (no torch)."""

from __future__ import annotations

import json
from typing import Any

from xsearch.errors import XSearchError

KEY_VERSION = "xsearch_version"
KEY_CONFIG = "xsearch_config"
KEY_TASK = "xsearch_task"
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "logits"


def build_metadata(config: dict[str, Any], task: dict[str, Any] | None, version: str) -> dict[str, str]:
    """String key/values for the ONNX ``metadata_props``."""
    return {
        KEY_VERSION: version,
        KEY_CONFIG: json.dumps(config, sort_keys=True),
        KEY_TASK: json.dumps(task, sort_keys=True) if task else "null",
    }


def parse_metadata(props: dict[str, str], source: str) -> dict[str, Any]:
    """``{"version", "config", "task"}`` from metadata props; ``ValueError`` naming ``source`` if absent."""
    if KEY_CONFIG not in props:
        raise XSearchError(f"{source} carries no xsearch metadata (was it exported by xsearch?)")
    try:
        return {
            "version": props.get(KEY_VERSION),
            "config": json.loads(props[KEY_CONFIG]),
            "task": json.loads(props.get(KEY_TASK, "null")),
        }
    except json.JSONDecodeError as e:
        raise XSearchError(f"{source}: malformed xsearch metadata ({e})") from None


#: JSON of a decoder export: its role ("prefill" | "step"), both files' names and the state's names.
KEY_DECODER = "xsearch_decoder"
PAST_LENGTH, PRESENT_LENGTH = "past_length", "present_length"


def decoder_names(layout: list[tuple[int, str, bool]]) -> dict[str, list[str]]:
    """Graph input/output names of a decoder's state, from ``(depth, name, is_kv_cache)`` per tensor."""
    past = [f"past_key_values.{i}.{n}" if kv else f"state.{i}.{n}" for i, n, kv in layout]
    present = [f"present.{i}.{n}" if kv else f"present_state.{i}.{n}" for i, n, kv in layout]
    return {
        "state_inputs": past,
        "state_outputs": present,
        "prefill_outputs": [PRESENT_LENGTH, *present],
        "step_inputs": [INPUTS[0], PAST_LENGTH, *past],
        "step_outputs": [PRESENT_LENGTH, *present],
    }


def step_path_for(path):
    """The step graph's file beside a decoder's prefill file: ``m.onnx`` -> ``m.step.onnx``."""
    return path.with_name(path.stem + ".step.onnx")
