"""``SuperTransformer``: one set of weights from which every model of a search space runs."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from xsearch.config import ModelConfig, describe_config
from xsearch.errors import XSearchError
from xsearch.supernet.layout import (
    config_seed,
    head_blocks,
    head_rows,
    inherited_tensors,
    projection_dim,
    region_key,
    supernet_name,
    variant_shapes,
)
from xsearch.supernet.settings import HEAD_LAYOUTS, LAYOUT_DEFAULTS, WIDTH_SCALING

#: The task's part of every subnet's config: a supernet is built for one task.
TASK_KEYS = ("vocab_size", "max_len", "head", "n_classes", "causal")
TEMPLATES_KEPT = 8  # subnets whose built module is kept for the next call


class SubnetMismatchError(XSearchError):
    """A subnet that is not in the supernet's space, or a supernet used for another space or task."""


class Slice(NamedTuple):
    """Where a subnet's tensor lives in the supernet: the supernet tensor's name, the subnet's shape of it, the
    factor the slice is multiplied by (1.0 but where ``width_scaling`` scales it), and, where one dimension is
    not a leading slice (the heads' rows of a ``per_head`` layout), that dimension and its indices."""

    source: str
    shape: tuple[int, ...]
    scale: float
    rows: tuple[int, torch.Tensor] | None = None

    @property
    def key(self) -> tuple:
        """The index of the subnet's part of the supernet tensor (``t[s.key]``)."""
        return region_key(self.shape, self.rows)


def _key(name: str) -> str:
    return name.replace(".", "__")  # ParameterDict keys cannot hold dots


class SuperTransformer(nn.Module):
    """The weights of every subnet of ``space`` for the task ``task_fields``.

    ``sn(input_ids, mask=None, *, subnet=cfg)`` runs the subnet ``cfg`` (a ``ModelConfig`` of the
    space, or its dict) with the supernet's weights; gradients reach the supernet's tensors, so
    training a sampled subnet trains the supernet. Build with ``build_supernet``.

    Attributes:
        space: the ``SearchSpace``.
        task_fields: the task's ``ModelConfig`` fields (``Task.model_fields()``).
        shapes: supernet tensor name -> shape.
        width_scaling: ``"none"``: a subnet's tensors are the plain leading slices (HAT). ``"fan_in"``: the
            slice of a ``nn.Linear`` weight that takes fewer inputs than the supernet's is multiplied by
            ``sqrt(supernet inputs / subnet inputs)``, the ratio of their initial scales (PyTorch's Linear
            init draws with a spread of ``1/sqrt(inputs)``), so a narrow subnet's layers start at the scale a
            model of its own width starts at, instead of shrunk by the wider ones' share of the inputs.
        head_layout: ``"leading"``: the shared q/k/v/out projections are leading slices like every other tensor
            (a narrower width's heads cut across a wider one's). ``"per_head"``: they hold one block of rows
            per head index, and each subnet's head ``h`` is the leading part of block ``h``
            (``xsearch.supernet.layout``).
    """

    def __init__(self, space, task_fields: dict[str, Any], *, init: bool = True, seed: int = 0,
                 width_scaling: str = "none", head_layout: str = "leading") -> None:  # fmt: skip
        super().__init__()
        if width_scaling not in WIDTH_SCALING:
            raise ValueError(f"unknown width_scaling {width_scaling!r} (valid: {', '.join(WIDTH_SCALING)})")
        if head_layout not in HEAD_LAYOUTS:
            raise ValueError(f"unknown head_layout {head_layout!r} (valid: {', '.join(HEAD_LAYOUTS)})")
        self.space = space
        self.task_fields = dict(task_fields)
        self.seed = seed
        self.width_scaling = width_scaling
        self.head_layout = head_layout
        self._blocks = head_blocks(space) if head_layout == "per_head" else None
        self._widest = max(space.model["d_model"].values())
        self._templates: OrderedDict[str, tuple[nn.Module, dict[str, Slice]]] = OrderedDict()
        self.weights = nn.ParameterDict()
        tensors = self._initial_tensors() if init else None
        self.shapes = {name: tuple(t.shape) for name, t in (tensors or self._initial_tensors(meta=True)).items()}
        for name, t in (tensors or {n: torch.empty(s) for n, s in self.shapes.items()}).items():
            if name in self._buffer_names:
                self.register_buffer(_key(name), t.detach().clone())
            else:
                self.weights[_key(name)] = nn.Parameter(t.detach().clone())

    # -- building ------------------------------------------------------------------------------
    def _largest_config(self) -> ModelConfig:
        m = self.space.model
        d = max(m["d_model"].values())
        ratio = max(m["ffn_ratio"].values()) if "ffn_ratio" in m else 4
        pos = "learned" if "pos_encoding" in m and "learned" in m["pos_encoding"].values() else "sinusoidal"
        layers = int(max(m["n_layers"].values()))
        heads = max(m["n_heads"].values())
        d_ff = max(1, int(round(d * ratio)))
        return ModelConfig(**self.task_fields, d_model=d, n_layers=layers, n_heads=heads, d_ff=d_ff,
                           attention="full", pos_encoding=pos)  # fmt: skip

    def _initial_tensors(self, *, meta: bool = False) -> dict[str, torch.Tensor]:
        """Shared tensors from the largest full-attention model; each variant's own from its largest build."""
        from xsearch.model import build_model

        causal, max_len = bool(self.task_fields.get("causal", False)), self.task_fields["max_len"]
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            with torch.device("meta") if meta else torch.device("cpu"):
                base = build_model(self._largest_config())
            names = ["full"] * base.config.n_layers
            out = {supernet_name(n, names): self._laid_out(n, t, base, meta) for n, t in inherited_tensors(base)}
            self._buffer_names = {supernet_name(n, names) for n, _ in base.named_buffers()}
            for variant in self.space.attention:
                shapes, builds, buffers = variant_shapes(self.space, variant, causal=causal, max_len=max_len)
                for layer in range(base.config.n_layers):
                    made: dict[str, dict[str, torch.Tensor]] = {}
                    for name, shape in shapes.items():
                        full = f"layers.{layer}.{variant}.{name}"
                        if name in buffers:
                            self._buffer_names.add(full)
                        if meta:
                            out[full] = torch.empty(shape, device="meta")
                            continue
                        tag = repr(builds[name])
                        if tag not in made:
                            made[tag] = dict(inherited_tensors(self._build_attention(variant, builds[name], causal,
                                                                                     max_len)))  # fmt: skip
                        out[full] = _padded(made[tag][name], shape)
            return out

    def _laid_out(self, name: str, t: torch.Tensor, base: nn.Module, meta: bool) -> torch.Tensor:
        """The largest model's tensor ``name`` as the supernet holds it: itself, or for a projection of a
        ``per_head`` layout, in its heads' rows of a tensor as wide as every head block (the rest drawn like it)."""
        rows = self._head_rows(base, name)
        if rows is None:
            return t
        shape = tuple(sum(self._blocks) if i == rows[0] else n for i, n in enumerate(t.shape))
        return torch.empty(shape, device="meta") if meta else _padded(t, shape, rows)

    @staticmethod
    def _build_attention(variant: str, build: dict[str, Any], causal: bool, max_len: int) -> nn.Module:
        from xsearch.attention import build_attention

        return build_attention(variant, build["d_model"], build["n_heads"], causal=causal, max_len=max_len,
                               **build["params"])  # fmt: skip

    # -- subnets -------------------------------------------------------------------------------
    def check_subnet(self, subnet: ModelConfig | dict[str, Any]) -> ModelConfig:
        """``subnet`` as a ``ModelConfig`` of this supernet's space and task.

        Raises:
            SubnetMismatchError: another task, a variant outside the space, or a size beyond the supernet's.
        """
        cfg = subnet if isinstance(subnet, ModelConfig) else ModelConfig.from_dict(dict(subnet))
        for key in TASK_KEYS:
            if key in self.task_fields and getattr(cfg, key) != self.task_fields[key]:
                raise SubnetMismatchError(f"subnet {key}={getattr(cfg, key)!r}, but the supernet was built for "
                                          f"{key}={self.task_fields[key]!r}")  # fmt: skip
        for i, layer in enumerate(cfg.layer_configs()):
            if layer["attention"] not in self.space.attention:
                raise SubnetMismatchError(
                    f"subnet layer {i} uses attention {layer['attention']!r}, which the supernet's space "
                    f"{self.space.name!r} does not hold ({', '.join(self.space.attention)})"
                )
        return cfg

    def _build_template(self, cfg: ModelConfig) -> nn.Module:
        from xsearch.model import build_model

        with torch.random.fork_rng():
            torch.manual_seed(config_seed(cfg.to_dict()))
            model = build_model(ModelConfig.from_dict(copy.deepcopy(cfg.to_dict())))
        return model

    def _template(self, cfg: ModelConfig) -> tuple[nn.Module, dict[str, Slice]]:
        """The built subnet (weights unused) and, per tensor it inherits, the supernet tensor's name, the
        subnet's shape of it and the factor it is scaled by (computed once per subnet: the training loop calls
        this every step)."""
        key = cfg.to_json()
        if key in self._templates:
            self._templates.move_to_end(key)
            return self._templates[key]
        model = self._build_template(cfg).to(self.device)  # (its own buffers where the supernet's tensors are)
        attention_of_layer = [layer["attention"] for layer in cfg.layer_configs()]
        linear = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        mapping = {}
        for name, t in inherited_tensors(model):
            source = supernet_name(name, attention_of_layer)
            held = self.shapes.get(source)
            rows = self._head_rows(model, name)
            if (held is None or len(held) != t.dim() or any(a > b for a, b in zip(t.shape, held, strict=True))
                    or rows == ()):  # fmt: skip
                raise SubnetMismatchError(
                    f"subnet {describe_config(cfg)} is not in the supernet's space {self.space.name!r}: its {name} "
                    f"needs {tuple(t.shape)}, the supernet holds {held}" + (" in other heads" if rows == () else "")
                )
            # (the supernet's inputs of an out_proj laid out per head: the widest subnet's, not every block's)
            fan_in = self._widest if rows and rows[0] == 1 else held[-1]
            narrower = self.width_scaling == "fan_in" and name in linear and t.shape[1] < fan_in
            mapping[name] = Slice(source, tuple(t.shape), math.sqrt(fan_in / t.shape[1]) if narrower else 1.0,
                                  (rows[0], rows[1].to(self.device)) if rows else None)  # fmt: skip
        self._templates[key] = (model, mapping)
        while len(self._templates) > TEMPLATES_KEPT:
            self._templates.popitem(last=False)
        return model, mapping

    def _head_rows(self, model: nn.Module, name: str) -> tuple:
        """For a projection of a ``per_head`` layout, (its head dimension, the rows of its heads); () where its
        heads are not in the layout; None for every other tensor."""
        dim = projection_dim(name) if self._blocks is not None else None
        if dim is None:
            return None
        attn = model.get_submodule(".".join(name.split(".")[:3]))
        rows = head_rows(self._blocks, attn.n_heads, attn.head_dim)
        return () if rows is None else (dim, rows)

    def tensor(self, name: str) -> torch.Tensor:
        """The supernet tensor ``name`` (a parameter or buffer)."""
        key = _key(name)
        return self.weights[key] if key in self.weights else getattr(self, key)

    def subnet_tensors(self, subnet) -> dict[str, torch.Tensor]:
        """Subnet tensor name -> its leading slice of the supernet (views: gradients reach the supernet)."""
        return self._slices(self._template(self.check_subnet(subnet))[1])

    def _slices(self, mapping: dict[str, Slice]) -> dict[str, torch.Tensor]:
        return {name: self._slice(s) for name, s in mapping.items()}

    def _slice(self, s: Slice) -> torch.Tensor:
        """The supernet's part ``s``, times its scale where that is not 1."""
        t = self.tensor(s.source)[s.key]
        return t * s.scale if s.scale != 1.0 else t

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None, *, subnet) -> torch.Tensor:
        model, mapping = self._template(self.check_subnet(subnet))
        model.train(self.training)
        return functional_call(model, self._slices(mapping), (input_ids, mask))

    def bind(self, subnet) -> BoundSubnet:
        """``subnet`` as a module with the plain ``forward(input_ids, mask)``, on this supernet's weights."""
        return BoundSubnet(self, self.check_subnet(subnet))

    def __repr__(self) -> str:  # (not nn.Module's: it would list every tensor)
        layout = "".join(f", {k}={v!r}" for k, v in self.layout.items() if v != LAYOUT_DEFAULTS[k])
        return f"SuperTransformer(space={self.space.name!r}, tensors={len(self.shapes)}, " \
               f"parameters={self.n_parameters():,}{layout})"  # fmt: skip

    @property
    def layout(self) -> dict[str, str]:
        """How subnets take their tensors from the supernet (``build_supernet``'s keywords of that)."""
        return {key: getattr(self, key) for key in LAYOUT_DEFAULTS}

    @property
    def device(self) -> torch.device:
        """Where the supernet's tensors are (``sn.to(device)`` moves them; subnets then run there)."""
        return next(iter(self.weights.values())).device

    def _apply(self, fn, *args, **kwargs):  # (.to, .cuda, ...: the kept templates follow the tensors)
        self._templates.clear()
        return super()._apply(fn, *args, **kwargs)

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.weights.values())


class BoundSubnet(nn.Module):
    """One subnet of a supernet with the forward of a plain model (``evaluate``, ``train`` take it)."""

    def __init__(self, sn: SuperTransformer, subnet: ModelConfig) -> None:
        super().__init__()
        self.sn, self.config = sn, subnet

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.sn(input_ids, mask, subnet=self.config)


def _padded(src: torch.Tensor, shape: tuple[int, ...], rows: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
    """``src`` in the leading corner (or ``rows``) of a tensor of ``shape``; the rest drawn like ``src`` (mean,
    std)."""
    if tuple(src.shape) == tuple(shape):
        return src.detach().clone()
    src = src.detach()
    std = float(src.float().std()) if src.numel() > 1 else 0.0
    out = torch.randn(shape, dtype=src.dtype) * std + float(src.float().mean())
    out[region_key(tuple(src.shape), rows)] = src
    return out


def build_supernet(space, task_fields: dict[str, Any], *, seed: int = 0, width_scaling: str = "none",
                   head_layout: str = "leading") -> SuperTransformer:  # fmt: skip
    """A ``SuperTransformer`` over ``space`` (a ``SearchSpace`` or a shipped name / YAML path) for a task.

    Args:
        space: the space; loaded for the task (``causal``, ``max_len``) when given by name.
        task_fields: ``Task.model_fields()`` (vocabulary, length, head).
        seed: the initial weights' seed.
        width_scaling: ``"none"`` or ``"fan_in"`` (see ``SuperTransformer``).
        head_layout: ``"leading"`` or ``"per_head"`` (see ``SuperTransformer``).
    """
    from xsearch.search_spaces import SearchSpace, load_space

    if not isinstance(space, SearchSpace):
        space = load_space(space, causal=bool(task_fields.get("causal", False)), max_len=task_fields["max_len"])
    missing = [k for k in ("vocab_size", "max_len") if k not in task_fields]
    if missing:
        raise XSearchError(f"build_supernet: task_fields lacks {', '.join(missing)} (pass Task.model_fields())")
    return SuperTransformer(space, task_fields, seed=seed, width_scaling=width_scaling, head_layout=head_layout)


def extract_subnet(sn: SuperTransformer, subnet) -> nn.Module:
    """A plain ``XSearchModel`` holding exactly ``subnet``'s weights (copies), in eval mode.

    Its forward equals ``sn(..., subnet=subnet)``; it saves, loads, trains, prunes and exports like any model.
    """
    cfg = sn.check_subnet(subnet)
    model = sn._build_template(cfg)
    tensors = sn.subnet_tensors(cfg)
    with torch.no_grad():
        for name, t in inherited_tensors(model):
            t.copy_(tensors[name])
    return model.eval()


def warm_start(sn: SuperTransformer, model: nn.Module) -> int:
    """Copy a trained model's weights into ``sn``: the inverse of ``extract_subnet``.

    ``model`` (an ``XSearchModel`` whose config is a subnet of the supernet's space and task, such as the space's
    reference trained alone) puts each of its tensors in its part of the supernet tensor that holds it;
    every other supernet weight is left as it is (divided by the slice's factor where the supernet scales it:
    ``width_scaling``). Afterwards ``extract_subnet(sn, model.config)`` equals ``model`` (to rounding where a
    factor is not a power of two).

    Returns:
        How many of the supernet's scalars were overwritten.

    Raises:
        SubnetMismatchError: the model is of another task, or not a subnet of the space.
    """
    cfg = sn.check_subnet(getattr(model, "config", None) or {})
    _, mapping = sn._template(cfg)
    given = dict(inherited_tensors(model))
    if set(given) != set(mapping):
        odd = sorted(set(given) ^ set(mapping))[0]
        raise SubnetMismatchError(f"warm start: the model's tensors differ from its config's subnet ({odd})")
    copied = 0
    with torch.no_grad():
        for name, t in given.items():
            s = mapping[name]
            if tuple(t.shape) != s.shape:
                raise SubnetMismatchError(f"warm start: the model's {name} is {tuple(t.shape)}, its config's "
                                          f"{s.shape}")  # fmt: skip
            sn.tensor(s.source)[s.key] = t / s.scale if s.scale != 1.0 else t
            copied += t.numel()
    return copied


__all__ = ["SubnetMismatchError", "SuperTransformer", "build_supernet", "extract_subnet", "warm_start"]
