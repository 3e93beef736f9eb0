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
