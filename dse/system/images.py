"""The images a point's requests carry (``images``, ``image_size``) applied to its workload: each
model code becomes the model whose requests carry them (``workloads.encoder.with_images``: its
vision encoder runs before the prefill), and each point's prompt grows by the images' tokens
(``workloads.vision.request_image_tokens``), so the LLM's prefill, KV cache, context check and
serving all see prompt_len + image tokens (under lognormal lengths the image tokens spread with the
prompt's). DseError naming the column for a model without a vision tower, a bad size, or images with
a trace of lengths or with cpu_layers."""
from __future__ import annotations

import numpy as np

from basis.errors import DseError
from dse.system.columns import Columns, anywhere, group, pointwise
from workloads.encoder import with_images
from workloads.vision import parse_image_size, request_image_tokens


def image_columns(cols: Columns, w: dict) -> None:
    """Apply ``images`` and ``image_size`` to ``w`` (the evaluator's workload arrays): ``model`` and
    ``models`` (one code per distinct model, image count and size) and ``prompt`` (plus the image
    tokens). Nothing changes where no point asks for images."""
    images = cols.numbers("images")
    scodes, sizes = cols.labels("image_size")
    try:                                       # checked where given, images or not
        parsed = [parse_image_size(s) for s in sizes]
    except DseError as e:
        raise DseError(f"{cols.where}: {e}") from None
    if not anywhere(pointwise(lambda x: x > 0, images)):
        return
    n = cols.n
    imgs = np.broadcast_to(np.asarray(images, dtype=float), (n,)).astype(np.int64)
    codes = np.broadcast_to(np.asarray(w["model"]), (n,))
    inv, order, starts = group([codes, imgs, np.broadcast_to(scodes, (n,))], n)
    models, extra = [], np.zeros(len(starts) - 1)
    for g in range(len(starts) - 1):
        i = int(order[starts[g]])
        base, k = w["models"][codes[i]], int(imgs[i])
        if k and base.vision is None:
            raise DseError(f"{cols.where}: images: model '{base.name}' has no vision tower (vision_config) this "
                           f"reader models; give images 0 or a vision-language model (qwen3-vl-8b-instruct, "
                           f"gemma-3-27b-it)")
        m = with_images(base, k, *parsed[scodes[i]])
        models.append(m)
        extra[g] = request_image_tokens(m.vision)
    if np.any((np.broadcast_to(np.asarray(w["cpu_layers"], dtype=float), (n,)) > 0) & (imgs > 0)):
        raise DseError(f"{cols.where}: images: a split of layers onto the host CPU (cpu_layers) is not modelled "
                       f"with a vision encoder; give cpu_layers 0 with images")
    trace = np.array([spec.kind == "trace" for spec in w["length_specs"]])[np.broadcast_to(w["lengths"], (n,))]
    if np.any(trace & (imgs > 0)):
        raise DseError(f"{cols.where}: images: a trace of lengths gives each request's prompt as its rows say, "
                       f"without the images' tokens; give lengths 'fixed' or 'lognormal' with images")
    w["model"], w["models"] = inv, models
    w["prompt"] = np.asarray(w["prompt"], dtype=float) + extra[inv]
