"""Translations of xsearch's custom torch ops to onnxruntime's contrib operators (domain
``com.microsoft``), handed to ``torch.onnx.export`` as its ``custom_translation_table``.

The onnx package does not know the contrib operators' schemas, and onnxscript needs one to
build a node, so the one used here is declared (inputs, outputs, the attributes set).
"""

from __future__ import annotations

from typing import Any

MS_DOMAIN = "com.microsoft"


def _declare_multi_head_attention() -> None:
    import onnx
    from onnx.defs import OpSchema

    if onnx.defs.has("MultiHeadAttention", MS_DOMAIN):
        return
    param = OpSchema.FormalParameter
    onnx.defs.register_schema(
        OpSchema(
            "MultiHeadAttention",
            MS_DOMAIN,
            1,
            inputs=[param("query", "T"), param("key", "T"), param("value", "T")],
            outputs=[param("output", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "")],
            attributes=[
                OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "number of heads"),
                OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "scale of q k^T"),
            ],
        )
    )


def custom_translations() -> dict[Any, Any]:
    """``{torch op: onnxscript function}`` for every xsearch custom op."""
    import onnxscript
    import torch
    from onnxscript import opset18 as op

    import xsearch.attention  # noqa: F401  (registers torch.ops.xsearch.attention)

    _declare_multi_head_attention()
    ms = onnxscript.values.Opset(domain=MS_DOMAIN, version=1)

    def attention(q, k, v, scale: float):
        # (B, H, L, D) -> (B, L, H*D): the layout MultiHeadAttention reads. The transposes
        # usually cancel against the ones that split the heads.
        heads = int(q.shape[1])
        flat = op.Constant(value_ints=[0, 0, -1])
        q3, k3, v3 = (op.Reshape(op.Transpose(t, perm=[0, 2, 1, 3]), flat) for t in (q, k, v))
        out = ms.MultiHeadAttention(q3, k3, v3, num_heads=heads, scale=float(scale))  # (B, L, H*Dv)
        out = op.Reshape(out, op.Constant(value_ints=[0, 0, heads, -1]))
        return op.Transpose(out, perm=[0, 2, 1, 3])

    return {torch.ops.xsearch.attention.default: attention}
