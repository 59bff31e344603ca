"""``torch.compile`` of the student, a block at a time (regional compilation).

A transformer is a stack of identical blocks. Compiled in place one by one, they share one compiled graph (the
blocks run the same code; their weights are inputs), so compiling costs one block's time, not the model's, and the
state dict keeps its keys (checkpoints and the exported folder are unchanged). Fused kernels replace the blocks'
unfused elementwise and norm work, which changes the numerics slightly: it is opt-in (``--model.compile true``).

Graphs are compiled for the shapes they meet: a second shape recompiles once with dynamic sizes (PyTorch's
automatic dynamic shapes), which then serve every later shape, so a run compiles a handful of times at most.
Bucketed batches (:class:`students.sampling.TokenBudgetBatches`, padded to a multiple of 64) keep those shapes few
and aligned.
"""

from __future__ import annotations

from torch import nn


def repeated_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The longest ``ModuleList`` of two or more modules of one class in ``model`` (a transformer's layers)."""
    stacks = [
        m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(b) for b in m}) == 1
    ]
    return max(stacks, key=len, default=None)


def compile_blocks(model: nn.Module) -> int:
    """Compile, in place, each block of ``model``'s stack of repeated blocks (the whole model if it has none).

    Returns:
        The modules compiled.
    """
    blocks = repeated_blocks(model)
    targets = list(blocks) if blocks is not None else [model]
    for module in targets:
        module.compile()
    return len(targets)
