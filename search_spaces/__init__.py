"""Search spaces: YAML files validated on load and turned into define-by-run Optuna suggestions.

A space names the model dimensions (``d_model``, ``n_layers``, ``n_heads``, ``ffn_ratio``,
``weight_sharing``, ...), the attention variants with their parameters, and the reference
(vanilla Transformer) configuration that every study starts with. A value is a list
(categorical), a mapping ``{low, high[, step][, log]}`` (an int or float range) or a scalar
(fixed). Variant parameters are suggested under namespaced names (``attention.linformer.k``).
A space with ``per_layer: true`` draws the attention, its parameters, the heads and the FFN
ratio for each layer (``layers.0.attention``, ...).

    from xsearch.search_spaces import load_space, list_spaces
    space = load_space("default", causal=False, max_len=512)
    cfg = space.suggest(trial, task)            # -> ModelConfig
"""

from xsearch.search_spaces.dims import Dim, SpaceError
from xsearch.search_spaces.draw import BoundaryDraw, RandomDraw, ShrinkingDraw
from xsearch.search_spaces.loader import MODEL_KEYS, list_spaces, load_space, load_space_for_task, space_from_yaml
from xsearch.search_spaces.space import SearchSpace

__all__ = [
    "MODEL_KEYS",
    "Dim",
    "BoundaryDraw",
    "RandomDraw",
    "SearchSpace",
    "ShrinkingDraw",
    "SpaceError",
    "list_spaces",
    "load_space",
    "load_space_for_task",
    "space_from_yaml",
]
