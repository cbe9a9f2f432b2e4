// Tap rows from any framework's tensor: DLPack (torch, numpy, cupy, ...) and the CUDA array
// interface, read where they lie. numpy arrays and lists keep the module's own path.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "tpdraft/tpdraft.h"

namespace tpdraft_python {

namespace py = pybind11;

// Where a step entry's taps were read from.
struct TensorTaps {
  py::object keep;       // what must stay alive until the step returns (a capsule, a copy, the tensor)
  int device = -1;       // the CUDA device of device taps; -1: host memory
};

// Fills t.taps, t.taps_dtype, t.n_new, t.taps_on_device and t.taps_stream from `tensor` when it
// speaks DLPack or the CUDA array interface (false, nothing read, when it speaks neither).
// backend is the drafter's ("cpu", "cuda"; "served" for a client, which takes host memory only).
// stream: None (device taps: the producer's current stream, as torch reports it, else none), an
// int (a cudaStream_t) or an object with cuda_stream / ptr. Errors name the entry's 'taps'.
bool read_tensor_taps(const py::handle& tensor, const py::object& stream, const std::string& backend,
                      int64_t width, tpdraft_step_entry& t, TensorTaps* out);

// Results as torch tensors: torch.from_numpy, moved to cuda:device when device >= 0.
py::object to_torch(const py::object& array, int device);

}  // namespace tpdraft_python
