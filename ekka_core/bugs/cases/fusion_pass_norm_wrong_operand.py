"""Bug case ``fusion-pass-norm-wrong-operand``: a post-grad fusion pass rewires the fused add + RMSNorm's variance to
one operand of the residual add (the incoming residual), so only the compiled default normalises wrongly."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS


def _fused_add_norm_pass_wrong_operand() -> None:
    """The class of vLLM #41972 (the ROCm AITER allreduce + RMSNorm fusion replaced the pattern with a fused kernel
    fed the wrong residual operand, ``empty_like`` instead of zeros; MiniMax-M2.5 GSM8K collapsed with the fusion
    pass on) and #48330 (a residual RMSNorm + quant pattern matched graphs it must not): a custom post-grad pass
    that rewrites a graph wrongly, seen only where the engine compiles. Injected through Inductor's
    ``post_grad_custom_post_pass`` hook (the one vLLM's own pass manager uses): the first residual RMSNorm's variance
    is computed from the incoming residual alone, not from its sum with the attention output. Eager vLLM runs no pass: the
    case is clean under ``enforce_eager``, proven by its own traced baseline."""
    import hashlib
    import inspect

    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    aten, prims = torch.ops.aten, torch.ops.prims

    class FusedAddNormWrongOperand(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            for node in graph.nodes:
                if node.op == "call_function" and node.target is aten.pow.Tensor_Scalar:
                    src = node.args[0]
                    while src.op == "call_function" and src.target is prims.convert_element_type.default:
                        src = src.args[0]
                    if src.op == "call_function" and src.target is aten.add.Tensor:
                        # vLLM's fused_add_rms_norm adds ``x + residual``: the variance of the residual alone
                        node.replace_input_with(node.args[0], src.args[-1])
                        return

        def uuid(self) -> str:
            # Inductor's FX graph cache keys a custom pass by this: the pass's own source, so an edit recompiles
            return "ekka-bug-fusion-pass-norm-wrong-operand-" + hashlib.sha256(
                inspect.getsource(FusedAddNormWrongOperand).encode()).hexdigest()[:16]

    inductor_config.post_grad_custom_post_pass = FusedAddNormWrongOperand()


BUG = Bug("fusion-pass-norm-wrong-operand", "llama",
          "A post-grad fusion pass feeds the fused add + RMSNorm's variance the wrong operand: only the compiled "
          "default normalises wrongly",
          "https://github.com/vllm-project/vllm/pull/41972 (and https://github.com/vllm-project/vllm/pull/48330; "
          "analogue: a custom fusion pass's rewrite wires the wrong operand)",
          r"^model\.layers\.0(\.post_attention_layernorm)?$", _fused_add_norm_pass_wrong_operand,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=8,
          expected_culprit=["compilation"], expected_rank=3, expected_kind="compiled",
          expected_words=r"layernorm\.py:\d+.*compiler stage: post-grad pass FusedAddNormWrongOperand")
