"""The query parameters that name a target (/recommend, /suggest): one copy, read into rec.Target."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from service import limits as L
from service.analytics import recommend as rec
from service.analytics.on_target import names_family
from service.analytics.target import parse_model_params

SIZE_HELP = ("8B | 1.34B | 8e9 | 8030261248. A round size (8B, 70B: at most 2 significant figures) names the "
             "heatmap's size family (8B: the 7–8B row, 8.03B and 8.86B models alike); a more precise one, or the "
             "dims, names one model")


def model_query(
    num_layers: Annotated[int | None, Query(ge=1, le=L.MAX_LAYERS)] = None,
    hidden_size: Annotated[int | None, Query(ge=1, le=L.MAX_HIDDEN)] = None,
    num_heads: Annotated[int | None, Query(ge=1, le=L.MAX_HEADS)] = None,
    num_kv_heads: Annotated[int | None, Query(ge=1, le=L.MAX_HEADS, description="GQA key/value heads")] = None,
    ffn_hidden_size: Annotated[int | None, Query(ge=1, le=L.MAX_FFN)] = None,
    vocab_size: Annotated[int | None, Query(ge=1, le=L.MAX_VOCAB)] = None,
    gated_linear_unit: Annotated[bool | None, Query(
        description="gated MLP (SwiGLU/GeGLU, three matrices) or not (GPT's GELU, two)")] = None,
    framework: Annotated[str | None, Query(max_length=200, description="nanotron, Megatron-LM, torchtitan … "
                                           "(a recorded name, or a part of one: 'nemo'); default: the runs'")] = None,
    precision: Annotated[str | None, Query(max_length=32, description="bf16 | fp8 | fp16 …; default bf16")] = None,
) -> dict:
    """The model's dims and MLP shape, the framework and precision a target is costed for."""
    return {"num_layers": num_layers, "hidden_size": hidden_size, "num_heads": num_heads, "num_kv_heads": num_kv_heads,
            "ffn_hidden_size": ffn_hidden_size, "vocab_size": vocab_size, "gated_linear_unit": gated_linear_unit,
            "framework": framework, "precision": precision}


def target_query(
    model_params: Annotated[str, Query(min_length=1, max_length=40, description=SIZE_HELP)],
    nodes: Annotated[int, Query(ge=1, le=L.MAX_NODES)],
    model: Annotated[dict, Depends(model_query)],
    gpus_per_node: Annotated[int, Query(ge=1, le=L.MAX_GPUS_PER_NODE)] = 8,
    gpu_type: Annotated[str | None, Query(max_length=100, description="default: the most recorded")] = None,
    seq_len: Annotated[int | None, Query(ge=1, le=L.MAX_SEQ_LEN,
                                         description="default: the most recorded on the GPU type")] = None,
    global_batch_tokens: Annotated[int | None, Query(ge=1, le=L.MAX_TOKENS)] = None,
) -> rec.Target:
    """rec.Target from the query; 422 naming the field for a size or cluster beyond service/limits.py."""
    L.check_parallelism({"nodes": nodes, "gpus_per_node": gpus_per_node})
    params = parse_model_params(model_params)
    L.check_model_params(params)
    return rec.Target(model_params=params, nodes=nodes, gpus_per_node=gpus_per_node, gpu_type=gpu_type,
                      seq_len=seq_len, global_batch_tokens=global_batch_tokens, family=names_family(model_params),
                      **model)


TargetDep = Annotated[rec.Target, Depends(target_query)]
