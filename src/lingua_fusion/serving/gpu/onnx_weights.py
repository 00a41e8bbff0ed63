"""An ONNX file's weights (initializers) as numpy arrays and its nodes' op types and inputs, read with the protobuf
runtime onnxruntime already needs.

The ``onnx`` package is not a dependency, and onnxruntime does not hand out a session's initializers, so the few
ONNX fields needed are declared here by their numbers in onnx.proto (ModelProto.graph = 7; GraphProto.node = 1,
initializer = 5; NodeProto.input = 1, op_type = 4; TensorProto dims/data_type/float_data/int64_data/name/raw_data/
data_location = 1/2/4/7/8/9/14) and parsed by protobuf; every other field of the file is skipped as unknown.
Only tensors stored inside the file (raw_data or float_data/int64_data) are read: a model with external data raises
ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FLOAT, _INT64 = 1, 7  # TensorProto.DataType
_DTYPES: dict[int, type[np.generic]] = {_FLOAT: np.float32, _INT64: np.int64}

_Field = descriptor_pb2.FieldDescriptorProto


@cache
def _model_class() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(name="lingua_fusion_onnx_subset.proto", package="lf_onnx",
                                            syntax="proto2")
    tensor = fd.message_type.add(name="Tensor")
    for name, number, kind, label in (("dims", 1, _Field.TYPE_INT64, _Field.LABEL_REPEATED),
                                      ("data_type", 2, _Field.TYPE_INT32, _Field.LABEL_OPTIONAL),
                                      ("float_data", 4, _Field.TYPE_FLOAT, _Field.LABEL_REPEATED),
                                      ("int64_data", 7, _Field.TYPE_INT64, _Field.LABEL_REPEATED),
                                      ("name", 8, _Field.TYPE_STRING, _Field.LABEL_OPTIONAL),
                                      ("raw_data", 9, _Field.TYPE_BYTES, _Field.LABEL_OPTIONAL),
                                      ("data_location", 14, _Field.TYPE_INT32, _Field.LABEL_OPTIONAL)):
        tensor.field.add(name=name, number=number, type=kind, label=label)
    node = fd.message_type.add(name="Node")
    node.field.add(name="input", number=1, type=_Field.TYPE_STRING, label=_Field.LABEL_REPEATED)
    node.field.add(name="op_type", number=4, type=_Field.TYPE_STRING, label=_Field.LABEL_OPTIONAL)
    graph = fd.message_type.add(name="Graph")
    graph.field.add(name="node", number=1, type=_Field.TYPE_MESSAGE, label=_Field.LABEL_REPEATED,
                    type_name=".lf_onnx.Node")
    graph.field.add(name="initializer", number=5, type=_Field.TYPE_MESSAGE, label=_Field.LABEL_REPEATED,
                    type_name=".lf_onnx.Tensor")
    model = fd.message_type.add(name="Model")
    model.field.add(name="graph", number=7, type=_Field.TYPE_MESSAGE, label=_Field.LABEL_OPTIONAL,
                    type_name=".lf_onnx.Graph")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("lf_onnx.Model"))


def _array(t: Any) -> np.ndarray:
    dtype = _DTYPES.get(t.data_type)
    if dtype is None:
        raise ValueError(f"initializer {t.name!r}: data type {t.data_type} is not read (float32 and int64 are)")
    if t.data_location == 1:
        raise ValueError(f"initializer {t.name!r} is stored outside the file")
    shape = tuple(int(d) for d in t.dims)
    if t.raw_data:
        flat = np.frombuffer(t.raw_data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    else:
        flat = np.asarray(t.float_data if dtype is np.float32 else t.int64_data, dtype=dtype)
    if flat.size != int(np.prod(shape)):
        raise ValueError(f"initializer {t.name!r}: {flat.size} values for shape {shape}")
    return flat.reshape(shape)


@dataclass(frozen=True)
class OnnxNode:
    op_type: str
    inputs: tuple[str, ...]  # "" where an optional input is left out


@dataclass(frozen=True)
class OnnxGraph:
    initializers: dict[str, np.ndarray]
    nodes: tuple[OnnxNode, ...]  # in the file's (topological) order

    def only(self, op_type: str) -> OnnxNode:
        """The graph's one node of ``op_type`` (ValueError if none or several)."""
        found = [n for n in self.nodes if n.op_type == op_type]
        if len(found) != 1:
            raise ValueError(f"{len(found)} {op_type} nodes, one expected")
        return found[0]


def read_graph(path: str | Path) -> OnnxGraph:
    """The initializers (float32 and int64 tensors) and nodes of the ONNX file at ``path``'s main graph."""
    model = _model_class()()
    model.ParseFromString(Path(path).read_bytes())
    return OnnxGraph(initializers={t.name: _array(t) for t in model.graph.initializer},
                     nodes=tuple(OnnxNode(n.op_type, tuple(n.input)) for n in model.graph.node))
