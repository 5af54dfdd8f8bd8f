"""What a loaded vLLM model holds, for `LLM.apply_model(held_bytes)` (it runs inside each
worker; set VLLM_ALLOW_INSECURE_SERIALIZATION=1 so that vLLM sends it there)."""

from __future__ import annotations

PLANE_MARK = ".rp1_"


def held_bytes(model) -> dict:
    """The bytes of the model's parameters and buffers, and of the tensors and QTensor planes
    its modules keep as plain attributes, every storage counted once, by kind: "planes" (rp1
    planes), "weights" (other parameters: norms, float weights), "buffers" (rotary caches and
    the like), "kv_cache" (vLLM's, one storage for all layers: its size is VLLM_CPU_KVCACHE_SPACE
    or the GPU memory left), and the four largest buffers by name; "experts" is the part of
    planes and weights that the models' routed-experts layers hold (`.experts.` in the name)."""
    seen: set[int] = set()
    kinds = {"planes": 0, "weights": 0, "buffers": 0, "kv_cache": 0}
    experts = 0
    buffers: dict[str, int] = {}
    named = [(n, t, "weights") for n, t in model.named_parameters(remove_duplicate=False)]
    named += [(n, t, "buffers") for n, t in model.named_buffers(remove_duplicate=False)]
    named += list(_held_by_attributes(model))
    for name, tensor, kind in named:
        storage = tensor.untyped_storage()
        if tensor.numel() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        if PLANE_MARK in "." + name:
            kind = "planes"
        kinds[kind] += storage.nbytes()
        if kind in ("planes", "weights") and ".experts." in "." + name:
            experts += storage.nbytes()
        if kind == "buffers":
            buffers[name] = storage.nbytes()
    largest = dict(sorted(buffers.items(), key=lambda kv: -kv[1])[:4])
    return {**kinds, "experts": experts, "largest_buffers": largest}


def _held_by_attributes(model):
    """(name, tensor, kind) of what modules hold outside their parameters and buffers: plain
    tensor attributes, QTensors (their planes) and lists of either."""
    import torch

    for module_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            for i, item in enumerate(value if isinstance(value, (list, tuple)) else [value]):
                planes = getattr(item, "planes", None)
                if isinstance(planes, dict):
                    for field, plane in planes.items():
                        yield f"{module_name}.{attr}.{i}{PLANE_MARK}{field}", plane, "planes"
                elif isinstance(item, torch.Tensor):
                    yield f"{module_name}.{attr}.{i}", item, "kv_cache" if attr == "kv_cache" else "buffers"
