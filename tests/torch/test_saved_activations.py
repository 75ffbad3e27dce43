"""What PyTorch's tensor parallelism saves for backward, against meshplan's activation accounting.

The harness's torchtitan-style plan (``crosscheck.apply_tp``) is applied to one block of the scaled-down
reference model under a fake process group, and every tensor autograd saves is recorded with the module
that saved it (``torch.autograd.graph.saved_tensors_hooks``). With sequence parallelism the norms run on
the rank's shard of the sequence and their outputs are all-gathered before the column-parallel linears,
which save the gathered, whole-sequence input for their weight gradient (PyTorch gathers nothing again
in backward, where Megatron-core saves the shard and re-gathers): memory.activation_parts_per_token with
``gathered_inputs`` counts those inputs whole.
"""

from tests.conftest import requires_torch

import meshplan

pytestmark = requires_torch

TP = 4
SEQ = 96  # no saved weight shard of the scaled-down model is (SEQ, hidden)


def _saved_by_module(sequence_parallel: bool, storages: dict[str, list[int]] | None = None
                     ) -> tuple[object, dict[str, list[tuple[int, ...]]]]:
    """(the scaled-down spec, the local shape of every tensor saved for backward, by the module that saved
    it); ``storages``, if given, receives the address of each one's storage in the same order."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from meshplan.harness.crosscheck import _reset_process_group, apply_tp
    from meshplan.harness.reference_model import build_model, scale_down

    spec = scale_down(meshplan.load_model("llama-3-8b"))
    _reset_process_group(TP)
    try:
        mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
        model = build_model(spec)
        apply_tp(model, mesh["tp"], sequence_parallel=sequence_parallel)
        model.to(torch.bfloat16)
        block = model.layers[0]
        current = ["block"]
        for name, module in block.named_modules():
            module.register_forward_pre_hook(lambda m, a, name=name: current.__setitem__(0, name))
        saved: dict[str, list[tuple[int, ...]]] = {}

        def pack(t):
            local = t.to_local() if isinstance(t, DTensor) else t
            saved.setdefault(current[0], []).append(tuple(local.shape))
            if storages is not None:
                storages.setdefault(current[0], []).append(local.untyped_storage().data_ptr())
            return t

        tokens = SEQ // TP if sequence_parallel else SEQ
        x = torch.randn(1, tokens, spec.hidden, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    finally:
        dist.destroy_process_group()
    return spec, saved


def test_pytorch_sequence_parallel_linears_save_the_gathered_input():
    from meshplan.cost.memory import activation_parts_per_token

    spec, saved = _saved_by_module(sequence_parallel=True)

    def tokens_saved(module: str) -> set[int]:
        """Token counts of the (tokens, hidden) activations ``module`` saved."""
        return {shape[-2] for shape in saved[module] if len(shape) >= 2 and shape[-1] == spec.hidden}

    for linear in ("attention.wq", "feed_forward.w1"):
        assert SEQ in tokens_saved(linear), (linear, saved[linear])  # the gathered input: every token
    assert tokens_saved("attention_norm") == {SEQ // TP}, saved["attention_norm"]  # the norm: the rank's shard
    parts = activation_parts_per_token(spec, ffn_hidden=spec.ffn_hidden, tp=TP, sp=True, flash_attention=True,
                                       seq_len=SEQ, gathered_inputs=True)
    # bytes per token of the sequence: the whole bf16 input (2 bytes x hidden), once for QKV and once for the MLP
    assert parts["qkv_input"] == parts["mlp_input"] == 2.0 * spec.hidden
    assert parts["norm_inputs"] == 4.0 * spec.hidden / TP


def test_torchtitan_attention_saves_expanded_kv_and_its_output_once():
    """torchtitan's attention repeats K and V to every query head before SDPA, which saves Q, K, V and its
    output; the output projection saves that same output as its input (SDPA returns it in the
    projection's layout, so the transpose-and-contiguous between them copies nothing). The harness's
    model attends the same way: memory.activation_parts_per_token with ``kv_expanded`` counts what it
    saves."""
    from meshplan.cost.memory import activation_parts_per_token

    storages: dict[str, list[int]] = {}
    spec, saved = _saved_by_module(sequence_parallel=True, storages=storages)
    heads, head_dim = spec.n_heads // TP, spec.qk_head_dim
    per_head = [(shape, ptr) for module in saved for shape, ptr in zip(saved[module], storages[module], strict=True)
                if len(shape) == 4 and shape[1:] == (heads, SEQ, head_dim)]  # (batch, heads, seq, dim)
    assert len(per_head) == 4, saved  # Q, K and V at every query head, and the output
    wo_input = [ptr for shape, ptr in zip(saved["attention.wo"], storages["attention.wo"], strict=True)
                if shape == (SEQ, heads * head_dim)]
    assert len(wo_input) == 1 and wo_input[0] in {ptr for _, ptr in per_head}  # the output's own storage
    parts = activation_parts_per_token(spec, ffn_hidden=spec.ffn_hidden, tp=TP, sp=True, flash_attention=True,
                                       seq_len=SEQ, gathered_inputs=True, kv_expanded=True)
    bf16 = 2.0
    assert parts["qkv"] == 3 * bf16 * heads * head_dim  # bytes per token of the sequence
    assert parts["attn_out"] == bf16 * heads * head_dim


def test_the_eager_swiglu_saves_four_tensors_of_its_width():
    """The harness's MLP, w2(silu(w1 x) * w3 x) in eager PyTorch as torchtitan runs it, saves silu's input
    and output, w3's output and the product (four distinct storages of the FFN width), where a fused
    SwiGLU saves three: memory.activation_parts_per_token with ``glu_saves_activation`` counts four."""
    from meshplan.cost.memory import activation_parts_per_token

    storages: dict[str, list[int]] = {}
    spec, saved = _saved_by_module(sequence_parallel=True, storages=storages)
    width = spec.ffn_hidden // TP
    ffn = {ptr for module in saved for shape, ptr in zip(saved[module], storages[module], strict=True)
           if shape[-1] == width and SEQ in shape}  # (tokens, F/t) activations, not the (F/t, D) weights
    assert len(ffn) == 4, saved
    parts = {glu: activation_parts_per_token(spec, ffn_hidden=spec.ffn_hidden, tp=TP, sp=True, flash_attention=True,
                                             seq_len=SEQ, gathered_inputs=True, glu_saves_activation=glu)["mlp"]
             for glu in (True, False)}
    bf16 = 2.0
    assert parts[True] == 4 * bf16 * width and parts[False] == 3 * bf16 * width
