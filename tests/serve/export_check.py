"""Checks an export of `cohort export` from Python, for tests/serve/export_test.cc.

  export_check.py onnx MODEL.onnx
      onnx.checker.check_model(full_check=True); prints the graph's inputs,
      outputs (dims as numbers or names), opset, producer and metadata as JSON.
  export_check.py torchscript MODEL.ts.pt float32|int64 D0,D1,... IN.bin OUT.bin
      torch.jit.load, forward on the raw input, the output (float32) to OUT.bin;
      prints {"dims": [...], "info": <cohort.json>} as JSON.
"""
import json
import sys


def dims_of(value_info):
    return [d.dim_param if d.dim_param else d.dim_value for d in value_info.type.tensor_type.shape.dim]


def check_onnx(path):
    import onnx
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    print(json.dumps({
        "ir_version": model.ir_version,
        "opset": [[o.domain, o.version] for o in model.opset_import],
        "producer": model.producer_name,
        "metadata": {p.key: p.value for p in model.metadata_props},
        "inputs": {i.name: dims_of(i) for i in model.graph.input},
        "outputs": {o.name: dims_of(o) for o in model.graph.output},
        "ops": sorted({n.op_type for n in model.graph.node}),
    }))


def run_torchscript(path, dtype, dims, in_file, out_file):
    import numpy as np
    import torch
    extra = {"cohort.json": ""}
    module = torch.jit.load(path, _extra_files=extra)
    shape = [int(d) for d in dims.split(",")]
    array = np.fromfile(in_file, dtype=np.float32 if dtype == "float32" else np.int64).reshape(shape)
    with torch.no_grad():
        out = module(torch.from_numpy(array))
    out.detach().to(torch.float32).contiguous().numpy().tofile(out_file)
    print(json.dumps({"dims": list(out.shape), "info": json.loads(extra["cohort.json"])}))


if __name__ == "__main__":
    if sys.argv[1] == "onnx":
        check_onnx(sys.argv[2])
    else:
        run_torchscript(*sys.argv[2:7])
