// Tap rows from DLPack capsules and the CUDA array interface. The DLPack structs are declared
// here as the protocol lays them out (dlpack.h, ABI version 0.x), so that no framework's headers
// are needed: only what a capsule's producer wrote is read.
#include "tensors.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

namespace tpdraft_python {

using namespace pybind11::literals;  // "key"_a = value

namespace {

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL: C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
constexpr uint8_t kDLFloat = 2, kDLBfloat = 4;

std::string device_name(const DLDevice& d) {
  const char* kind = d.device_type == kDLCPU           ? "cpu"
                     : d.device_type == kDLCUDA        ? "cuda"
                     : d.device_type == kDLCUDAHost    ? "cuda_host"
                     : d.device_type == kDLCUDAManaged ? "cuda_managed"
                     : d.device_type == 10             ? "rocm"
                                                       : nullptr;
  if (kind == nullptr) return "a device of DLPack type " + std::to_string(d.device_type);
  return std::string(kind) + ":" + std::to_string(d.device_id);
}

bool host_device(int32_t type) { return type == kDLCPU || type == kDLCUDAHost; }

// Device taps are refused where they cannot be read: on the cpu backend, and by a client (a
// server takes host memory).
void check_backend_reads(const std::string& where, const std::string& backend) {
  if (backend == "cuda") return;
  const std::string advice = "give host memory (e.g. tensor.cpu())";
  if (backend == "served")
    throw py::value_error("entry 'taps' lies on " + where + ", but a served drafter takes host memory only: " + advice);
  throw py::value_error("entry 'taps' lies on " + where + ", but this drafter runs on the " + backend +
                        " backend: " + advice);
}

// torch, once it is imported by the caller: the tensor type and the calls the fast path needs.
struct Torch {
  py::object tensor, to_dlpack, current_stream, from_numpy;
};
const Torch* torch_if_loaded() {
  static Torch* torch = nullptr;  // kept for the interpreter's life
  if (torch != nullptr) return torch;
  if (!py::module_::import("sys").attr("modules").contains("torch")) return nullptr;
  const py::module_ m = py::module_::import("torch");
  torch = new Torch{m.attr("Tensor"), py::module_::import("torch.utils.dlpack").attr("to_dlpack"),
                    m.attr("cuda").attr("current_stream"), m.attr("from_numpy")};
  return torch;
}

// A stream given as an int (a cudaStream_t) or as an object carrying one (torch's cuda_stream,
// cupy's ptr); 0, the legacy default stream, becomes cudaStreamLegacy (1), which the library
// can wait for.
intptr_t stream_pointer(const py::handle& s) {
  py::object v = py::reinterpret_borrow<py::object>(s);
  if (py::hasattr(v, "cuda_stream")) v = v.attr("cuda_stream");
  else if (py::hasattr(v, "ptr")) v = v.attr("ptr");
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw py::type_error("entry 'stream' must be a CUDA stream (an int, or an object with cuda_stream), got " +
                         py::repr(s).cast<std::string>());
  const intptr_t p = v.cast<intptr_t>();
  return p == 0 ? 1 : p;
}

int32_t dtype_of(const DLDataType& d) {
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) return TPDRAFT_F32;
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 16) return TPDRAFT_F16;
  if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) return TPDRAFT_BF16;
  throw py::type_error("entry 'taps' must hold f32, f16 or bf16 values, got DLPack dtype code " +
                       std::to_string(d.code) + " of " + std::to_string(d.bits) + " bits x " +
                       std::to_string(d.lanes) + " lanes");
}

void check_shape(int64_t ndim, const int64_t* shape, int64_t width) {
  if (ndim == 2 && shape[1] == width) return;
  std::string got;
  for (int64_t i = 0; i < ndim; ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
  throw py::value_error("entry 'taps' must be [n_new, " + std::to_string(width) + "], got shape (" + got + ")");
}

// A strided host matrix copied row-major, for tensors that are not C-contiguous.
py::array packed_copy(const char* data, int32_t dtype, int64_t rows, int64_t cols, const int64_t* strides) {
  const size_t size = dtype == TPDRAFT_F32 ? 4 : 2;
  py::array copy = size == 4 ? py::array(py::dtype::of<float>(), {rows, cols})
                             : py::array(py::dtype::of<uint16_t>(), {rows, cols});
  char* to = static_cast<char*>(copy.mutable_data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(to + (r * cols + c) * size, data + (r * strides[0] + c * strides[1]) * size, size);
  return copy;
}

// The CUDA array interface (version 2 or 3): device memory with a numpy typestr; no bf16.
void read_cuda_array_interface(const py::handle& tensor, const py::object& stream, const std::string& backend,
                               int64_t width, tpdraft_step_entry& t, TensorTaps* out) {
  check_backend_reads("a CUDA device (__cuda_array_interface__)", backend);
  const py::dict cai = tensor.attr("__cuda_array_interface__");
  const auto shape = cai["shape"].cast<std::vector<int64_t>>();
  check_shape(static_cast<int64_t>(shape.size()), shape.data(), width);
  const std::string typestr = cai["typestr"].cast<std::string>();
  if (typestr == "<f4") t.taps_dtype = TPDRAFT_F32;
  else if (typestr == "<f2") t.taps_dtype = TPDRAFT_F16;
  else
    throw py::type_error("entry 'taps' must hold f32 or f16 values (bf16 through DLPack), got __cuda_array_interface__ "
                         "typestr '" + typestr + "'");
  const int64_t item = t.taps_dtype == TPDRAFT_F32 ? 4 : 2;
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    const auto strides = cai["strides"].cast<std::vector<int64_t>>();
    if ((shape[0] > 1 && strides[0] != width * item) || (width > 1 && strides[1] != item))
      throw py::value_error("entry 'taps' in device memory must be C-contiguous (call .contiguous())");
  }
  t.taps = reinterpret_cast<const void*>(py::tuple(cai["data"])[0].cast<uintptr_t>());
  t.n_new = shape[0];
  t.taps_on_device = 1;
  // The producer's stream (version 3) unless the caller names one.
  if (!stream.is_none()) t.taps_stream = reinterpret_cast<void*>(stream_pointer(stream));
  else if (cai.contains("stream") && !cai["stream"].is_none()) t.taps_stream = reinterpret_cast<void*>(stream_pointer(cai["stream"]));
  out->keep = py::reinterpret_borrow<py::object>(tensor);
  out->device = -2;  // a CUDA device the interface does not name
}

}  // namespace

bool read_tensor_taps(const py::handle& tensor, const py::object& stream, const std::string& backend,
                      int64_t width, tpdraft_step_entry& t, TensorTaps* out) {
  if (!py::hasattr(tensor, "__dlpack__")) {
    if (!py::hasattr(tensor, "__cuda_array_interface__")) return false;
    read_cuda_array_interface(tensor, stream, backend, width, t, out);
    return true;
  }
  const Torch* torch = torch_if_loaded();
  const bool from_torch = torch != nullptr && py::isinstance(tensor, torch->tensor);
  py::object capsule;
  intptr_t consumer_stream = stream.is_none() ? 0 : stream_pointer(stream);
  if (from_torch) {
    // torch's own export: a C call, where Tensor.__dlpack__ is Python.
    capsule = torch->to_dlpack(tensor);
  } else {
    const py::object d = tensor.attr("__dlpack_device__")();
    if (!py::isinstance<py::tuple>(d) || py::len(d) != 2 || !py::isinstance<py::int_>(d[py::int_(0)]) ||
        !py::isinstance<py::int_>(d[py::int_(1)]))
      throw py::type_error("entry 'taps': its __dlpack_device__ gave " + py::repr(d).cast<std::string>() +
                           ", expected (device_type, device_id)");
    const DLDevice device{d[py::int_(0)].cast<int32_t>(), d[py::int_(1)].cast<int32_t>()};
    if (!host_device(device.device_type)) check_backend_reads(device_name(device), backend);
    capsule = host_device(device.device_type) || consumer_stream == 0
                  ? tensor.attr("__dlpack__")()
                  : tensor.attr("__dlpack__")("stream"_a = consumer_stream);
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw py::type_error("entry 'taps': its __dlpack__ gave no unused 'dltensor' capsule");
  }
  // The capsule stays unconsumed: its own destructor frees the tensor once the step is done.
  const DLTensor& dl = managed->dl_tensor;
  const bool on_host = host_device(dl.device.device_type);
  if (!on_host) {
    check_backend_reads(device_name(dl.device), backend);
    if (dl.device.device_type != kDLCUDA && dl.device.device_type != kDLCUDAManaged)
      throw py::value_error("entry 'taps' lies on " + device_name(dl.device) + ", which the cuda backend cannot read");
  }
  t.taps_dtype = dtype_of(dl.dtype);
  check_shape(dl.ndim, dl.shape, width);
  const int64_t rows = dl.shape[0];
  const char* data = static_cast<const char*>(dl.data) + dl.byte_offset;
  const bool contiguous = dl.strides == nullptr || ((rows <= 1 || dl.strides[0] == width) &&
                                                    (width <= 1 || dl.strides[1] == 1));
  out->keep = capsule;
  t.n_new = rows;
  t.taps = data;
  if (on_host) {
    if (!contiguous) {
      py::array copy = packed_copy(data, t.taps_dtype, rows, width, dl.strides);
      t.taps = copy.data();
      out->keep = copy;
    }
    return true;
  }
  if (!contiguous) throw py::value_error("entry 'taps' in device memory must be C-contiguous (call .contiguous())");
  t.taps_on_device = 1;
  out->device = dl.device.device_id;
  if (consumer_stream == 0 && from_torch) consumer_stream = stream_pointer(torch->current_stream(tensor.attr("device")));
  t.taps_stream = reinterpret_cast<void*>(consumer_stream);
  return true;
}

py::object to_torch(const py::object& array, int device) {
  const Torch* torch = torch_if_loaded();
  if (torch == nullptr) {
    try {
      py::module_::import("torch");
    } catch (const py::error_already_set&) {
      throw py::value_error("out='torch' needs torch, which this interpreter cannot import");
    }
    torch = torch_if_loaded();
  }
  py::object t = torch->from_numpy(array);
  if (device == -1) return t;
  return t.attr("to")(device >= 0 ? "cuda:" + std::to_string(device) : std::string("cuda"));
}

}  // namespace tpdraft_python
