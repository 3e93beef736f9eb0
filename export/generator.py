"""``Generator``: token-by-token generation from a decoder export, with onnxruntime and numpy only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xsearch.decoding import Sampler, check_options, generate_loop, prompts_of
from xsearch.errors import MissingPathError, XSearchError
from xsearch.export.metadata import INPUTS, KEY_DECODER, OUTPUT, PAST_LENGTH, PRESENT_LENGTH, parse_metadata
from xsearch.tasks.encoding import Encoding


def _session(path: Path, threads: int | None, providers: list[str] | None):
    import onnxruntime as ort

    if not path.is_file():
        raise MissingPathError(f"no such ONNX file: {path}")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
            raise XSearchError(f"threads must be an integer > 0, got {threads!r}")
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types for a bad file
        raise XSearchError(f"cannot load {path} with onnxruntime: {e}") from None


def _ortvalue(value: Any) -> Any:
    """``value`` as an onnxruntime ``OrtValue`` (numpy arrays are wrapped, OrtValues kept)."""
    import onnxruntime as ort

    if isinstance(value, ort.OrtValue):
        return value
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))


def is_decoder_export(session: Any) -> bool:
    """Whether an onnxruntime session holds a decoder export (prefill or step graph)."""
    return KEY_DECODER in session.get_modelmeta().custom_metadata_map


class Generator:
    """A decoder exported by ``to_onnx(model, path, decoder=True)``, ready to generate.

    Args:
        path: the decoder's ``.onnx`` file (its prefill graph; the step graph's file is named in
            its metadata and lies beside it). The step file itself is accepted too.
        threads: onnxruntime intra-op threads (default: onnxruntime's choice).
        providers: onnxruntime execution providers (default: CPU).
        step_path: the step graph's file, where it is not beside ``path`` under its own name.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        threads: int | None = None,
        providers: list[str] | None = None,
        *,
        step_path: str | os.PathLike | None = None,
    ):
        p = Path(path)
        first = _session(p, threads, providers)
        meta = parse_metadata(first.get_modelmeta().custom_metadata_map, str(p))
        raw = first.get_modelmeta().custom_metadata_map.get(KEY_DECODER)
        if raw is None:
            raise XSearchError(f"{p} is not a decoder export (export it with --decoder / to_onnx(..., decoder=True))")
        decoder = json.loads(raw)
        if decoder["role"] == "step":  # given the step file: open its prefill file
            p = p.with_name(decoder["prefill_file"])
            first = _session(p, threads, providers)
        self.prefill_session = first
        self.step_session = _session(Path(step_path) if step_path else p.with_name(decoder["step_file"]), threads,
                                     providers)  # fmt: skip
        self.path = str(p)
        self.config: dict[str, Any] = meta["config"]
        self.task: dict[str, Any] | None = meta["task"]
        self.max_len = int(self.config["max_len"])
        self.vocab_size = int(self.config["vocab_size"])
        self.state_inputs: list[str] = decoder["state_inputs"]
        self.state_outputs: list[str] = decoder["state_outputs"]
        enc = (self.task or {}).get("encoding")
        self.encoding = Encoding.from_dict(enc) if enc else None

    def prefill(self, input_ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Logits ``(B, N, V)`` of right-padded prompts and the state after them.

        The state stays in onnxruntime's memory (``OrtValue``s, fed back to ``step`` as they are): a
        round trip through numpy would copy every cache twice a token.
        """
        feed = {INPUTS[0]: _ortvalue(input_ids), INPUTS[1]: _ortvalue(mask)}
        outs = self.prefill_session.run_with_ort_values([OUTPUT, PRESENT_LENGTH, *self.state_outputs], feed)
        return outs[0].numpy(), self._state(outs[1:])

    def step(self, next_ids: np.ndarray, state: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        """Logits ``(B, V)`` after one more token per row, and the state that includes it (``state``'s
        values may be numpy arrays or ``OrtValue``s)."""
        feed = {INPUTS[0]: _ortvalue(np.asarray(next_ids, dtype=np.int64))}
        feed.update({name: _ortvalue(value) for name, value in state.items()})
        outs = self.step_session.run_with_ort_values([OUTPUT, PRESENT_LENGTH, *self.state_outputs], feed)
        return outs[0].numpy(), self._state(outs[1:])

    def _state(self, outs: list[Any]) -> dict[str, Any]:
        return {PAST_LENGTH: outs[0], **dict(zip(self.state_inputs, outs[1:]))}

    def generate(
        self,
        prompt_ids: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int = 0,
        stop: int | list[int] | None = None,
    ) -> list[int] | list[list[int]]:
        """New token ids after a prompt (a list of ids) or a batch of prompts (a list of lists);
        the same rule and seeding as ``xsearch.generate``."""
        prompts, single = prompts_of(prompt_ids, self.vocab_size)
        stop_ids = check_options(
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, stop=stop,
            longest_prompt=max(len(p) for p in prompts), max_len=self.max_len,
        )  # fmt: skip
        out = generate_loop(self.prefill, self.step, prompts, max_new_tokens, Sampler(temperature, top_k, seed),
                            stop_ids)  # fmt: skip
        return out[0] if single else out

    def generate_text(self, prompt: str, max_new_tokens: int, **options: Any) -> str:
        """The text generated after ``prompt``, through the task's encoding in the file's metadata."""
        if self.encoding is None:
            raise XSearchError(f"{self.path} carries no text encoding in its metadata; pass token ids to generate()")
        ids = self.encoding.encode(prompt)
        if not ids:
            raise XSearchError("the prompt is empty")
        return self.encoding.decode(self.generate(ids, max_new_tokens, **options))
