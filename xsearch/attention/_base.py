"""The attention interface every variant implements, and its declarative spec.

Every variant maps ``x: (B, N, D)`` with an optional key-padding ``mask: bool (B, N)``
(True = real token) to ``(B, N, D)``. Projections are named ``q_proj``, ``k_proj``,
``v_proj`` and ``out_proj`` so that pruning, adapters and quantization find them by name,
and heads are split as ``view(B, N, n_heads, head_dim)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from xsearch.attention._decode import State, append_at, lengths_of, slot_mask, take_at
from xsearch.attention._fused import fused_attention, fused_attention_applies
from xsearch.errors import XSearchError

FAMILIES = {
    "FP": "Fixed Patterns",
    "M": "Memory",
    "LP": "Learnable Patterns",
    "LR": "Low-Rank",
    "KR": "Kernels",
    "RC": "Recurrence",
}


#: Parameters measured in tokens (a block, a window, a segment, a memory, ...): at most the longest
#: sequence, or the default where that is longer (a 512-token window on 256 tokens is harmless; a
#: 100,000-token block would try to allocate terabytes). Search spaces drop longer choices on load.
LENGTH_PARAMS = frozenset({"block_size", "window", "segment_len", "bucket_size", "width", "stride", "radius",
                           "mem_len", "cmem_len", "n_global", "n_clusters", "block_h", "block_w", "memory",
                           "dilation"})  # fmt: skip
#: Counts whose cost grows with them long past any use: their largest values.
COUNT_LIMITS = {"n_hashes": 64, "n_iters": 50}


@dataclass(frozen=True)
class AttentionSpec:
    """What a variant is: its paper, survey family, cost, decoder support and parameters.

    Attributes:
        name: registry name, e.g. ``"linformer"``.
        paper: title of the paper that introduced the method.
        family: survey family codes (``FP``, ``M``, ``LP``, ``LR``, ``KR``, ``RC``).
        complexity: asymptotic cost in the sequence length, e.g. ``"O(N·k)"``.
        causal: whether the variant can be used as a decoder (no look-ahead).
        params: hyper-parameter name -> default value.
        quadratic: whether the cost grows as N² (the baseline class).
        small_params: overrides of ``params`` for a small instance (d_model 32, max_len 64):
            used by the conformance tests and the ``tiny`` search space.
    """

    name: str
    paper: str
    family: tuple[str, ...]
    complexity: str
    causal: bool
    params: dict[str, Any] = field(default_factory=dict)
    quadratic: bool = False
    small_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [f for f in self.family if f not in FAMILIES]
        if bad:
            raise XSearchError(f"attention {self.name!r}: unknown family code(s) {bad}; valid: {list(FAMILIES)}")
        self.resolve_params(self.small_params)

    def resolve_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Merge ``params`` over the defaults, checking names and types.

        Raises:
            ValueError: an unknown parameter name, or a value of the wrong type.
        """
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            valid = ", ".join(sorted(self.params)) or "none"
            raise XSearchError(f"attention {self.name!r} has no parameter {unknown[0]!r} (valid: {valid})")
        out = dict(self.params)
        for key, value in params.items():
            out[key] = _coerce(self.name, key, value, self.params[key])
        return out

    def check_limits(self, params: dict[str, Any], max_len: int | None) -> None:
        """Raise ``XSearchError`` naming a parameter beyond its limit (``LENGTH_PARAMS``, ``COUNT_LIMITS``)."""
        for key, value in params.items():
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if key in LENGTH_PARAMS and max_len is not None:
                limit = max(max_len, self.params.get(key, 0))
                if value > limit:
                    raise XSearchError(
                        f"attention {self.name!r}: parameter {key}={value} exceeds the longest sequence "
                        f"(max_len={max_len}); use at most {limit}"
                    )
            elif key in COUNT_LIMITS and value > COUNT_LIMITS[key]:
                raise XSearchError(f"attention {self.name!r}: parameter {key}={value} is over its limit of "
                                   f"{COUNT_LIMITS[key]}")  # fmt: skip


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of ``default`` (ints accepted where floats are)."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif default is None:
        ok = True
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise XSearchError(
            f"attention {name!r}: parameter {key!r} must be {kind.__name__}, got {value!r} ({type(value).__name__})"
        )
    return value


class Attention(nn.Module):
    """Base class of every attention variant.

    Subclasses set ``spec`` (through ``@register``), validate their parameters in
    ``check_params`` and implement ``attend(q, k, v, mask)`` on head-split tensors, or
    override ``forward`` when the method is not a function of q, k and v alone.
    """

    spec: ClassVar[AttentionSpec]
    #: The tensors of the decoding state besides ``length`` (see ``prefill``), in export order.
    state_names: ClassVar[tuple[str, ...]] = ("inputs",)
    #: Whether ``key``/``value`` of the state are a growing KV cache ``(B, H, past, Dh)`` (exported
    #: under onnxruntime-genai's names ``past_key_values.{i}.key`` -> ``present.{i}.key``).
    kv_cache: ClassVar[bool] = False
    # False where forward reads q/k/v_proj weights directly instead of calling the modules
    # (then tools that swap modules, such as torch dynamic quantization, must leave them).
    projections_called_as_modules: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        causal: bool = False,
        max_len: int | None = None,
        dropout: float = 0.0,
        head_dim: int | None = None,
        **params: Any,
    ) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0:
            raise XSearchError(f"d_model must be a positive int, got {d_model!r}")
        if not isinstance(n_heads, int) or n_heads <= 0:
            raise XSearchError(f"n_heads must be a positive int, got {n_heads!r}")
        if head_dim is None:
            if d_model % n_heads:
                raise XSearchError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass head_dim")
            head_dim = d_model // n_heads
        if not isinstance(head_dim, int) or head_dim <= 0:
            raise XSearchError(f"head_dim must be a positive int, got {head_dim!r}")
        if max_len is not None and (not isinstance(max_len, int) or max_len <= 0):
            raise XSearchError(f"max_len must be a positive int or None, got {max_len!r}")
        if not 0.0 <= dropout < 1.0:
            raise XSearchError(f"dropout must be in [0, 1), got {dropout!r}")
        if causal and not self.spec.causal:  # (build_attention names the variants that can)
            raise XSearchError(f"attention {self.spec.name!r} cannot be causal")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.causal = bool(causal)
        self.max_len = max_len
        self.params = self.spec.resolve_params(params)
        self.spec.check_limits(self.params, max_len)
        self.check_params(**self.params)
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner)
        self.k_proj = nn.Linear(d_model, inner)
        self.v_proj = nn.Linear(d_model, inner)
        self.out_proj = nn.Linear(inner, d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout_p = dropout

    # -- hooks for subclasses -------------------------------------------------------------
    def check_params(self, **params: Any) -> None:
        """Validate parameter values; raise ``ValueError`` naming the bad one."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention on head-split tensors ``(B, H, N, Dh)``; returns ``(B, H, N, Dh)``."""
        raise NotImplementedError  # abstractmethod: every variant defines attend or forward

    def prune_head_params(self, keep: torch.Tensor, rows: torch.Tensor) -> None:
        """Slice the variant's own head-tied parameters (beyond q/k/v/out) to heads ``keep``.

        Args:
            keep: sorted indices of the heads that stay.
            rows: the matching indices into the ``n_heads * head_dim`` projection width.
        """

    def prune_heads(self, keep) -> None:
        """Keep only the heads ``keep`` (in place): slices ``q_proj``/``k_proj``/``v_proj`` rows,
        ``out_proj`` columns and, through ``prune_head_params``, every head-tied parameter of the
        variant, then sets ``n_heads``. Tied ``k_proj``/``q_proj`` (shared QK) stay tied."""
        keep = torch.as_tensor(sorted(set(int(i) for i in keep)), dtype=torch.long)
        if len(keep) == 0 or keep[0] < 0 or keep[-1] >= self.n_heads:
            raise XSearchError(f"prune_heads: heads to keep must be a non-empty subset of 0..{self.n_heads - 1}")
        rows = (keep[:, None] * self.head_dim + torch.arange(self.head_dim)).reshape(-1)
        tied = self.k_proj.weight is self.q_proj.weight
        self.q_proj = slice_linear(self.q_proj, out_idx=rows)
        if tied:  # a separate module holding the very same parameters, as constructed
            k = nn.Linear(self.d_model, len(rows))
            k.weight, k.bias = self.q_proj.weight, self.q_proj.bias
            self.k_proj = k
        else:
            self.k_proj = slice_linear(self.k_proj, out_idx=rows)
        self.v_proj = slice_linear(self.v_proj, out_idx=rows)
        self.out_proj = slice_linear(self.out_proj, in_idx=rows)
        self.prune_head_params(keep, rows)
        self.n_heads = len(keep)

    # -- shared machinery --------------------------------------------------------------
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.check_input(x, mask)
        q, k, v = self.project_qkv(x)
        out = self.attend(q, k, v, mask)  # (B, H, N, Dh)
        return self.finish(out, mask)

    # -- decoding ---------------------------------------------------------------------------
    def prefill(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        """The causal layer on a prompt, and the state ``step`` continues from.

        Args:
            x: ``(B, N, D)``, right-padded where prompts differ in length; mask: bool ``(B, N)``,
                True = real token (None = all real).

        Returns:
            ``(B, N, D)`` (what ``forward`` returns) and the state: ``length: long (B,)`` and the
            tensors named in ``state_names``.

        This default keeps the layer's inputs, ``inputs: (B, N, D)``, and recomputes the layer over
        them for each new token: exact for every causal variant (an output depends on earlier
        tokens only, which the conformance tests check), a whole forward pass per token. Variants
        whose attention has a cheaper state (a KV cache, a window, running sums) override both.

        Raises:
            ValueError: the layer is not causal, or ``x``/``mask`` have the wrong shape.
        """
        mask = self.check_decoding(x, mask)
        kept = x if mask is None else x * mask[..., None].to(x.dtype)
        return self.forward(x, mask), {"length": lengths_of(x, mask), "inputs": kept}

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One new token per row, ``x_t: (B, D)``, after the tokens ``state`` has seen.

        Returns:
            ``(B, D)``: what ``forward`` gives at that position on the whole sequence, and the
            state that includes the token.
        """
        length = self.check_step(x_t, state)
        seen = append_at(state["inputs"], x_t, length, dim=1)  # (B, S + 1, D)
        y = self.forward(seen, slot_mask(length + 1, seen.shape[1]))
        return take_at(y, length, dim=1), {"length": length + 1, "inputs": seen}

    def check_decoding(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """``check_input``, and that this layer decodes (is causal)."""
        if not self.causal:
            raise XSearchError(f"{self.spec.name}: prefill/step need a causal layer (built with causal=True)")
        return self.check_input(x, mask)

    def check_step(self, x_t: torch.Tensor, state: State) -> torch.Tensor:
        """Validate a step's input and state; return ``state["length"]``."""
        if not self.causal:
            raise XSearchError(f"{self.spec.name}: prefill/step need a causal layer (built with causal=True)")
        if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2 or x_t.shape[-1] != self.d_model:
            shape = tuple(x_t.shape) if isinstance(x_t, torch.Tensor) else type(x_t).__name__
            raise XSearchError(f"{self.spec.name}: step needs x_t of shape (B, {self.d_model}), got {shape}")
        missing = [k for k in ("length", *self.state_names) if k not in state]
        if missing:
            raise XSearchError(f"{self.spec.name}: the state has no {missing[0]!r} (a state of another variant?)")
        length = state["length"]
        if length.shape != (x_t.shape[0],):
            raise XSearchError(f"{self.spec.name}: state length has shape {tuple(length.shape)}, "
                               f"the batch is {x_t.shape[0]}")  # fmt: skip
        return length

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q_proj``, ``k_proj``, ``v_proj`` of ``x``, split into heads ``(B, H, N, Dh)`` each.

        Without autograd (inference, export) and with plain ``nn.Linear`` projections the three
        run as one GEMM on the concatenated weights (about 20% faster at N = 8192 on CPU);
        otherwise, e.g. under adapters, quantized or pruned-while-tracing modules, or training,
        they run one by one, so every tool that wraps a projection sees it called.
        """
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if not torch.is_grad_enabled() and all(type(p) is nn.Linear and p.bias is not None for p in projs):
            w = torch.cat([p.weight for p in projs])
            b = torch.cat([p.bias for p in projs])
            sizes = [p.out_features for p in projs]
            return tuple(self.split_heads(t) for t in torch.nn.functional.linear(x, w, b).split(sizes, dim=-1))
        return tuple(self.split_heads(p(x)) for p in projs)

    def check_input(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """Validate shapes; return the mask as bool (or None when absent)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise XSearchError(f"{self.spec.name}: x must be a 3-D tensor (B, N, D), got shape {shape}")
        if x.shape[-1] != self.d_model:
            raise XSearchError(f"{self.spec.name}: x has D={x.shape[-1]} but d_model={self.d_model}")
        n = x.shape[1]
        if self.max_len is not None and not exporting() and n > self.max_len:
            raise XSearchError(f"{self.spec.name}: sequence length {n} exceeds max_len={self.max_len}")
        if mask is None:
            return None
        if mask.shape != x.shape[:2]:
            raise XSearchError(f"{self.spec.name}: mask shape {tuple(mask.shape)} != (B, N) = {tuple(x.shape[:2])}")
        return mask.bool()

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, N, H*Dh)`` -> ``(B, H, N, Dh)``."""
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, H, N, Dh)`` -> ``(B, N, H*Dh)``."""
        b, _, n, _ = t.shape
        return t.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim)

    def finish(self, out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Merge heads, project out, and zero padded positions (their values are undefined)."""
        y = self.dropout(self.out_proj(self.merge_heads(out)))
        if mask is not None:
            y = y * mask.unsqueeze(-1).to(y.dtype)
        return y

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def extra_repr(self) -> str:
        ps = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, causal={self.causal}" + (
            f", {ps}" if ps else ""
        )


def positive_int(name: str, key: str, value: int) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive int."""
    if value <= 0:
        raise XSearchError(f"attention {name!r}: parameter {key!r} must be > 0, got {value!r}")


def pad_to_multiple(t: torch.Tensor, multiple: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """Pad ``t`` along ``dim`` at the end so its size is a multiple of ``multiple``."""
    # No branch on the size: with a symbolic length (ONNX export) a zero-width pad is free
    # while a data-dependent `if` would freeze the length into the graph.
    extra = (-t.shape[dim]) % multiple
    pad_shape = list(t.shape)
    pad_shape[dim] = extra
    return torch.cat([t, t.new_full(pad_shape, value)], dim=dim)


def exporting() -> bool:
    """True while torch.export / tracing runs the model: variants then take their export-friendly
    paths (no Python loops over a symbolic length, shapes onnxruntime runs fastest); the tests check
    that both paths agree."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def export_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as torch's fused kernel likes it (bool), or, while exporting, as an additive float
    mask: onnxruntime then applies it with one broadcast Add instead of a Where over the scores
    (local attention at N = 1024: 33.3 -> 28.8 ms), while eager torch keeps the faster bool path."""
    return additive_mask(allowed, dtype) if exporting() else allowed


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, masked: float = float("-inf")) -> torch.Tensor:
    """A bool mask as an additive bias (0 where allowed, ``masked`` where not); a float bias as it is."""
    if allowed.dtype != torch.bool:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, masked)


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention through the fused kernel; ``allowed`` is a bool mask (True = may attend)
    or an additive float bias (0 = may attend, a large negative number = may not).

    Callers guarantee every query row has at least one allowed key (a padded query is
    allowed its own position), so no row is fully masked: eager torch and exported
    graphs disagree on fully masked rows.

    While exporting, the attention is written out as the graph onnxruntime runs fastest
    (``_attention_graph``), which also takes inputs of any rank >= 3 that broadcast.
    """
    if exporting() and dropout_p == 0.0:
        return _attention_graph(q, k, v, allowed, causal=causal and allowed is None, scale=scale)
    return torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=None if allowed is None else export_mask(allowed, q.dtype),
        dropout_p=dropout_p,
        is_causal=causal and allowed is None,
        scale=scale,
    )


def _attention_graph(q, k, v, allowed, *, causal: bool, scale: float | None) -> torch.Tensor:
    """``softmax(q k^T * scale + bias) v`` in the form an exported graph runs fastest.

    The exporter's own rendering of ``scaled_dot_product_attention`` reshapes keys to 3-D and
    transposes them there, a copy onnxruntime cannot fold into its MatMul (the largest single
    node of a small longformer model at N = 512); a transpose of the last two axes next to
    the MatMul is folded into it (``FusedMatMul``), and so is the scale.

    A mask that is the same for every query (padded keys, shape ``(..., 1, K)``) is folded into
    the product itself: queries gain a column of ones and keys a column holding the bias, so
    ``[q*scale, 1] . [k, bias] = q.k*scale + bias`` and no pass over the ``(Q, K)`` scores adds
    it. Without a mask left, 4-D attention becomes ``fused_attention``: one onnxruntime node
    that never writes the scores out.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if allowed is not None and isinstance(allowed.shape[-2], int) and allowed.shape[-2] == 1:  # not a symbolic length
        # Finite (fp16 holds it): exp(-1e4 - max) is 0 all the same, and no -inf meets a 0 in the product.
        bias = additive_mask(allowed, q.dtype, -1e4).clamp(min=-1e4).transpose(-2, -1)  # (..., K, 1)
        q = torch.cat([q * scale, torch.ones_like(q[..., :1])], dim=-1)
        k = torch.cat([k, bias.expand(*k.shape[:-1], 1)], dim=-1)
        scale, allowed = 1.0, None
    if allowed is None and fused_attention_applies(q, k, v):
        return fused_attention(q, k, v, scale)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores = scores if scale == 1.0 else scores * scale
    if allowed is not None:
        scores = scores + additive_mask(allowed, q.dtype)
    return torch.matmul(scores.softmax(dim=-1), v)


def slice_linear(linear: nn.Linear, *, out_idx: torch.Tensor | None = None, in_idx: torch.Tensor | None = None):
    """A new ``nn.Linear`` holding the selected output rows and/or input columns of ``linear``."""
    w = linear.weight.detach()
    b = None if linear.bias is None else linear.bias.detach()
    if out_idx is not None:
        w = w[out_idx]
        b = None if b is None else b[out_idx]
    if in_idx is not None:
        w = w[:, in_idx]
    out = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        if b is not None:
            out.bias.copy_(b)
    return out


def slice_param(p: torch.Tensor, idx: torch.Tensor, dim: int = 0) -> nn.Parameter:
    """A new ``nn.Parameter`` with the entries ``idx`` of ``p`` along ``dim``."""
    return nn.Parameter(p.detach().index_select(dim, idx.to(p.device)).clone(), requires_grad=p.requires_grad)
