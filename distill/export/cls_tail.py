"""A graph pass: the ops after the last layer's attention run on the first token only.

A cross-encoder's score reads one position of the last layer, ``[CLS]`` (``Gather(axis=1, index 0)`` before the
pooler), yet an exported graph computes every position of the last layer. The ops between the last
position-mixing op (attention) and that ``Gather`` are position-wise (the output projection, LayerNorms, the
feed-forward block), so the ``Gather`` can be taken at their inputs instead: they then run on ``[batch, 1, hidden]``
instead of ``[batch, sequence, hidden]``, and the graph computes the same function. For BERT-style students this
removes the last layer's output projection and feed-forward block for every token but one: 1/8 of MiniLM-L6's
weight FLOPs (the last layer's keys and values are still needed for every token).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

POSITION_WISE = {
    "MatMul",  # with a constant right-hand side only (a linear map of each position)
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Erf",
    "Tanh",
    "Relu",
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "LayerNormalization",
    "SkipLayerNormalization",
}
"""Ops that compute each position of their ``[batch, sequence, hidden]`` inputs on its own."""


def _constants(graph: Any) -> dict[str, Any]:
    """Tensor name -> value of every initializer and ``Constant`` node output."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            (attribute,) = node.attribute
            if attribute.name == "value":
                values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def _first_token_gather(graph: Any, constants: dict[str, Any]) -> Any | None:
    """The one ``Gather(axis=1, index 0)`` with a scalar index (the ``[CLS]`` read), or None."""
    from onnx import helper

    found = []
    for node in graph.node:
        if node.op_type != "Gather" or node.input[1] not in constants:
            continue
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
        index = constants[node.input[1]]
        if axis == 1 and index.ndim == 0 and int(index) == 0:
            found.append(node)
    return found[0] if len(found) == 1 else None


def run_tail_on_first_token(path: Path) -> int:
    """Rewrite the graph at ``path`` in place so that the position-wise ops feeding its ``[CLS]`` read run on the
    first token only; the number of ops that now do (0 where the graph has no such read, left unchanged)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    constants = _constants(graph)
    gather = _first_token_gather(graph, constants)
    if gather is None:
        return 0
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    graph_outputs = {o.name for o in graph.output}

    def position_wise(node: Any) -> bool:
        if node.op_type not in POSITION_WISE:
            return False
        return node.op_type != "MatMul" or node.input[1] in constants

    # The tail: position-wise nodes all of whose outputs feed only the tail or the gather (reverse topological order).
    tail: set[int] = {id(gather)}
    for node in reversed(graph.node):
        outputs = [o for o in node.output if o]
        if not position_wise(node) or any(o in graph_outputs for o in outputs):
            continue
        readers = [c for o in outputs for c in consumers[o]]
        if readers and all(id(c) in tail for c in readers):
            tail.add(id(node))
    if len(tail) == 1:
        return 0
    index = numpy_helper.from_array(constants[gather.input[1]].reshape(1), "first_token_index")
    graph.initializer.append(index)
    in_tail = {o for node in graph.node if id(node) in tail for o in node.output}
    cut: dict[str, str] = {}  # a tensor entering the tail -> its first token ([batch, 1, ...])
    nodes = []
    for node in graph.node:  # a new Gather goes just before its first reader: the order stays topological
        if id(node) in tail and node is not gather:
            for i, name in enumerate(node.input):
                if name and name not in constants and name not in in_tail:
                    if name not in cut:
                        cut[name] = f"{name}/first_token"
                        nodes.append(helper.make_node("Gather", [name, index.name], [cut[name]], cut[name], axis=1))
                    node.input[i] = cut[name]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(path))
    return len(tail) - 1
