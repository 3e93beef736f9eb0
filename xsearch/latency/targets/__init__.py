"""One module per kind of latency target; each registers its targets with ``@register_target``."""
