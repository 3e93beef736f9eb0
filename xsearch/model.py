"""The xsearch Transformer: embedding + positions + pre-LN blocks + a classify or LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention import build_attention, exporting
from xsearch.attention._decode import lengths_of
from xsearch.config import ModelConfig
from xsearch.errors import XSearchError


class FeedForward(nn.Module):
    """Position-wise MLP ``fc2(gelu(fc1(x)))``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x))))

    def prune_channels(self, keep) -> None:
        """Keep only the hidden channels ``keep`` (in place)."""
        from xsearch.attention import slice_linear

        keep = torch.as_tensor(sorted(set(int(i) for i in keep)), dtype=torch.long)
        if len(keep) == 0 or keep[0] < 0 or keep[-1] >= self.fc1.out_features:
            last = self.fc1.out_features - 1
            raise XSearchError(f"prune_channels: channels to keep must be a non-empty subset of 0..{last}")
        self.fc1 = slice_linear(self.fc1, out_idx=keep)
        self.fc2 = slice_linear(self.fc2, in_idx=keep)


class Block(nn.Module):
    """Pre-LN Transformer block; ``attn`` and ``ffn`` may be modules shared with other blocks."""

    def __init__(self, d_model: int, attn: nn.Module, ffn: nn.Module) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = ffn

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.ffn(self.ln2(x))

    def prefill(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """``forward`` and the attention's decoding state."""
        h, state = self.attn.prefill(self.ln1(x), mask)
        x = x + h
        return x + self.ffn(self.ln2(x)), state

    def step(self, x_t: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token per row, ``(B, D)``, through the block."""
        h, state = self.attn.step(self.ln1(x_t), state)
        x_t = x_t + h
        return x_t + self.ffn(self.ln2(x_t)), state


def sinusoidal_positions(n: int, d: int, *, nested: bool = False) -> torch.Tensor:
    """``(n, d)`` sinusoidal position table of Vaswani et al.: column pair ``k`` is the sine and cosine of
    ``position / 10000**e(k)``, with ``e(k) = 2k / d``.

    ``nested``: ``e(k)`` is ``k``'s binary digits mirrored about the binary point (the van der Corput sequence:
    0, 1/2, 1/4, 3/4, 1/8, ...). Where ``d / 2`` is a power of two these are the same exponents in another order,
    and for every width the table is the leading columns of any wider one's, so the subnets of a supernet with
    elastic width (which share the leading slice of its weights) all see one position signal; with the plain
    order each width's columns hold other frequencies.
    """
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    pairs = (d + 1) // 2
    e = torch.tensor([van_der_corput(k) for k in range(pairs)]) if nested else torch.arange(pairs) * 2.0 / d
    angle = pos / torch.pow(10000.0, e)
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d // 2])
    return table


def van_der_corput(k: int) -> float:
    """``k``'s binary digits mirrored about the binary point: 0, 1/2, 1/4, 3/4, 1/8, 5/8, ..."""
    out, weight = 0.0, 0.5
    while k:
        out += weight * (k & 1)
        k, weight = k >> 1, weight / 2
    return out


class XSearchModel(nn.Module):
    """A Transformer built from a ``ModelConfig``.

    ``forward(input_ids: long[B, N], mask: bool[B, N] | None)`` returns ``[B, n_classes]``
    (classify: mean over real tokens) or ``[B, N, vocab_size]`` (lm).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=0)
        if c.pos_encoding == "learned":
            self.pos = nn.Embedding(c.max_len, c.d_model)
        else:
            table = sinusoidal_positions(c.max_len, c.d_model, nested=c.pos_encoding == "nested_sinusoidal")
            self.register_buffer("pos_table", table, persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(self._build_blocks(c))
        self.ln_f = nn.LayerNorm(c.d_model)
        out = c.n_classes if c.head == "classify" else c.vocab_size
        self.head = nn.Linear(c.d_model, out)

    def _build_blocks(self, c: ModelConfig) -> list[Block]:
        def attn(layer: dict) -> nn.Module:
            return build_attention(
                layer["attention"],
                c.d_model,
                layer["n_heads"],
                causal=c.causal,
                max_len=c.max_len,
                dropout=c.dropout,
                head_dim=layer["head_dim"],
                **layer["attention_params"],
            )

        layers = c.layer_configs()
        if c.weight_sharing == "all":
            return [Block(c.d_model, attn(layers[0]), FeedForward(c.d_model, layers[0]["d_ff"], c.dropout))]
        shared_attn = attn(layers[0]) if c.weight_sharing == "attention" else None
        shared_ffn = FeedForward(c.d_model, layers[0]["d_ff"], c.dropout) if c.weight_sharing == "ffn" else None
        return [
            Block(c.d_model, shared_attn or attn(layer), shared_ffn or FeedForward(c.d_model, layer["d_ff"], c.dropout))
            for layer in layers
        ]

    def layers(self) -> list[Block]:
        """The block applied at each depth (the same object repeated under ``weight_sharing="all"``)."""
        if self.config.weight_sharing == "all":
            return [self.blocks[0]] * self.config.n_layers
        return list(self.blocks)

    def hidden_states(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final (layer-normed) hidden states ``(B, N, d_model)``."""
        mask = self._check(input_ids, mask)
        n = input_ids.shape[1]
        x = self.embed(input_ids)
        x = x + (self.pos.weight[:n] if self.config.pos_encoding == "learned" else self.pos_table[:n])
        x = self.drop(x)
        for block in self.layers():
            x = block(x, mask)
        return self.ln_f(x)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head_logits(self.hidden_states(input_ids, mask), mask)

    # -- decoding ---------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """A causal LM on a prompt: its logits and the state ``step`` continues from.

        Args:
            input_ids: long ``(B, N)``, right-padded where prompts differ in length; mask: bool
                ``(B, N)``, True = real token (None = all real).

        Returns:
            logits ``(B, N, vocab)`` (as ``forward``) and the state ``{"length": long (B,),
            "layers": [one dict of tensors per depth]}``.
        """
        mask = self._check_decoder(input_ids, mask)
        n = input_ids.shape[1]
        x = self.embed(input_ids)
        x = x + (self.pos.weight[:n] if self.config.pos_encoding == "learned" else self.pos_table[:n])
        states = []
        for block in self.layers():
            x, state = block.prefill(x, mask)
            states.append({k: t for k, t in state.items() if k != "length"})
        return self.head(self.ln_f(x)), {"length": lengths_of(input_ids, mask), "layers": states}

    def step(self, next_ids: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """The next token of each row, ``long (B,)``, after what ``state`` has seen.

        Returns:
            logits ``(B, vocab)`` for the token after it, and the state that includes it. The
            logits equal ``forward``'s at that position on the whole sequence.
        """
        self._check_decoder()
        length = self._check_state(next_ids, state)
        x = self.embed(next_ids)
        x = x + (self.pos(length) if self.config.pos_encoding == "learned" else self.pos_table[length])
        states = []
        for block, layer_state in zip(self.layers(), state["layers"]):
            x, new = block.step(x, {**layer_state, "length": length})
            states.append({k: t for k, t in new.items() if k != "length"})
        return self.head(self.ln_f(x)), {"length": length + 1, "layers": states}

    def _check_decoder(self, input_ids: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """Refuse a model that cannot decode; check a prompt's shapes and ids when one is given."""
        if not (self.config.causal and self.config.head == "lm"):
            raise XSearchError(
                f"prefill/step need a causal language model (causal=True, head='lm'); this one has "
                f"causal={self.config.causal}, head={self.config.head!r}"
            )
        return None if input_ids is None else self._check(input_ids, mask)

    def _check_state(self, next_ids: torch.Tensor, state: dict) -> torch.Tensor:
        integer = isinstance(next_ids, torch.Tensor) and next_ids.dtype in (torch.int64, torch.int32)
        if not integer or next_ids.dim() != 1:
            shape = tuple(next_ids.shape) if isinstance(next_ids, torch.Tensor) else type(next_ids).__name__
            raise XSearchError(f"step needs next_ids as a 1-D integer tensor (B,), got {shape}")
        if not isinstance(state, dict) or "length" not in state or "layers" not in state:
            raise XSearchError("step needs the state that prefill or step returned ({'length', 'layers'})")
        if len(state["layers"]) != self.config.n_layers:
            raise XSearchError(f"the state has {len(state['layers'])} layers, the model {self.config.n_layers}")
        length = state["length"]
        if length.shape != next_ids.shape:
            raise XSearchError(f"next_ids has {next_ids.shape[0]} rows, the state {length.shape[0]}")
        if not exporting():
            if int(length.max()) >= self.config.max_len:
                raise XSearchError(f"the sequence would exceed max_len={self.config.max_len}")
            if next_ids.min() < 0 or next_ids.max() >= self.config.vocab_size:
                bad = next_ids[(next_ids < 0) | (next_ids >= self.config.vocab_size)][0].item()
                raise XSearchError(f"token id {bad} outside the vocabulary [0, {self.config.vocab_size})")
        return length

    def head_logits(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from final hidden states (``classify``: pooled as ``config.pooling`` says)."""
        if self.config.head == "lm":
            return self.head(h)
        if self.config.pooling == "first":
            pooled = h[:, 0]
        elif mask is None:
            pooled = h.mean(dim=1)
        else:
            m = mask.to(h.dtype).unsqueeze(-1)
            pooled = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)

    def _check(self, input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise XSearchError(f"input_ids must be a 2-D tensor (B, N), got {shape}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise XSearchError(f"input_ids must be int64, got {input_ids.dtype}")
        if mask is not None and mask.shape != input_ids.shape:
            raise XSearchError(f"mask shape {tuple(mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
        if not exporting():
            n = input_ids.shape[1]
            if n > self.config.max_len:
                raise XSearchError(f"sequence length {n} exceeds max_len={self.config.max_len}")
            if n == 0:
                raise XSearchError("input_ids has length 0")
            if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
                bad = input_ids[(input_ids < 0) | (input_ids >= self.config.vocab_size)][0].item()
                raise XSearchError(f"token id {bad} outside the vocabulary [0, {self.config.vocab_size})")
        return None if mask is None else mask.bool()


def build_model(cfg: ModelConfig | dict) -> XSearchModel:
    """Build an ``XSearchModel`` from a ``ModelConfig`` (or its dict form)."""
    if isinstance(cfg, dict):
        cfg = ModelConfig.from_dict(cfg)
    if not isinstance(cfg, ModelConfig):
        raise XSearchError(f"build_model needs a ModelConfig or dict, got {type(cfg).__name__}")
    return XSearchModel(cfg)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (shared weights counted once)."""
    return sum(p.numel() for p in model.parameters())
