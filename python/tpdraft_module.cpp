// The Python module `tpdraft` over the C ABI (include/tpdraft/tpdraft.h), so that Python drives
// exactly the path C callers do: Drafter(drafter_dir, target_dir, **options), caps,
// open_session(), step(entries) with numpy arrays (or torch tensors: out="torch") back. Taps are
// numpy arrays (f32, f16; bf16 as uint16 with taps_dtype="bf16") or any tensor speaking DLPack or
// the CUDA array interface (tensors.h), read in place when C-contiguous; the GIL is released while
// a step runs. Library errors become tpdraft.Error (ArgumentError, InputError, UnavailableError)
// with its message. It is the private tpdraft._core; the package tpdraft (python/tpdraft/) re-exports it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "tensors.h"
#include "tpdraft/tpdraft.h"

namespace py = pybind11;
using namespace pybind11::literals;  // "key"_a = value

namespace {

PyObject* g_error = nullptr;           // tpdraft.Error
PyObject* g_argument_error = nullptr;  // tpdraft.ArgumentError(Error, ValueError)
PyObject* g_input_error = nullptr;     // tpdraft.InputError(Error)
PyObject* g_unavailable_error = nullptr;  // tpdraft.UnavailableError(Error): a served drafter is gone
PyObject* g_busy_error = nullptr;  // tpdraft.BusyError(UnavailableError): the server's queue was full

void raise_for(tpdraft_status status) {
  if (status == TPDRAFT_OK) return;
  PyObject* type = status == TPDRAFT_ERROR_ARGUMENT ? g_argument_error
                   : status == TPDRAFT_ERROR_INPUT  ? g_input_error
                   : status == TPDRAFT_ERROR_UNAVAILABLE ? g_unavailable_error
                   : status == TPDRAFT_ERROR_BUSY ? g_busy_error
                                                    : g_error;
  PyErr_SetString(type, tpdraft_last_error());
  throw py::error_already_set();
}

// Runs a library call without the GIL (other Python threads run meanwhile); raises its failure.
template <typename F>
void call_unlocked(F&& call) {
  tpdraft_status st;
  {
    py::gil_scoped_release unlocked;
    st = call();
  }
  raise_for(st);
}

struct Caps {
  std::string architecture, backend;
  int block_size = 0, tp = 0, max_sessions = 0, max_open_sessions = 0;
  int64_t taps_width = 0, hidden_size = 0, vocab_size = 0, mask_token_id = 0, max_context = 0, draft_vocab_size = 0;
  std::vector<int64_t> target_layer_ids;
};

// Caps' fields in the order Python lists them.
#define TPDRAFT_CAPS_FIELDS(X)                                                                                   \
  X(architecture) X(backend) X(block_size) X(tp) X(taps_width) X(hidden_size) X(vocab_size) X(draft_vocab_size) \
  X(mask_token_id) X(target_layer_ids) X(max_sessions) X(max_open_sessions) X(max_context)

// The arrays one step entry as Python gave it keeps alive during the call.
struct Staged {
  py::array taps;
  tpdraft_python::TensorTaps tensor;  // taps given as a tensor
  py::array_t<int64_t> tokens, dist_ids;
  py::array_t<float> q, dist_probs, dist_rest;
};

// The keys a step entry may hold.
const char* const kEntryKeys[] = {"session", "anchor", "taps", "taps_dtype", "keep", "p0",
                                  "temperature", "top_k", "top_p", "seed", "dist", "stream"};

// Edit distance, for naming the key a misspelt one was meant to be.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Refuses a key no entry holds, naming the nearest one a caller may have meant.
void check_entry_keys(const py::dict& e) {
  for (const auto& item : e) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error("an entry's keys are strings, got " + py::repr(item.first).cast<std::string>());
    const std::string key = item.first.cast<std::string>();
    const char* nearest = kEntryKeys[0];
    for (const char* k : kEntryKeys) {
      if (key == k) nearest = nullptr;
      if (nearest == nullptr) break;
      if (edit_distance(key, k) < edit_distance(key, nearest)) nearest = k;
    }
    if (nearest != nullptr)
      throw py::key_error("unknown entry key '" + key + "' (did you mean '" + nearest + "'?)");
  }
}

const char* kind_of(const int64_t*) { return "an integer"; }
const char* kind_of(const uint64_t*) { return "a non-negative integer"; }
const char* kind_of(const double*) { return "a number"; }
const char* kind_of(const std::string*) { return "a string"; }

// d[key] as a T (fallback when absent); a value of another type (a bool for a number too) is a
// TypeError naming the key.
template <typename T>
T get(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  const py::object v = d[key];
  const bool number = !std::is_same_v<T, std::string>;
  if (!(number && py::isinstance<py::bool_>(v))) {
    try {
      return v.cast<T>();
    } catch (const py::cast_error&) {
    }
  }
  throw py::type_error(std::string("entry '") + key + "' must be " + kind_of(static_cast<const T*>(nullptr)) +
                       ", got " + py::repr(v).cast<std::string>());
}

// The calls of an in-process drafter (tpdraft_*) and of a client of a served one
// (tpdraft_client_*): the same names after the prefix, so that one Python class body serves both.
#define TPDRAFT_ENDPOINT_API(Name, H, is_served, what, P)   \
  struct Name {                                             \
    using Handle = H;                                       \
    static constexpr bool served = is_served;               \
    static constexpr const char* closed = what;             \
    static constexpr auto close = P##close;                 \
    static constexpr auto caps = P##caps_get;               \
    static constexpr auto open_session = P##session_open;   \
    static constexpr auto close_session = P##session_close; \
    static constexpr auto length = P##session_length;       \
    static constexpr auto step = P##step;                   \
    static constexpr auto times = P##last_step_times;       \
  };
TPDRAFT_ENDPOINT_API(InProcess, tpdraft_drafter, false, "the drafter is closed", tpdraft_)
TPDRAFT_ENDPOINT_API(Served, tpdraft_client, true, "the client is closed", tpdraft_client_)
#undef TPDRAFT_ENDPOINT_API

template <typename Api>
class Endpoint {
 public:
  using Handle = typename Api::Handle;
  Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint() { close(); }

  // No call starts once the handle is cleared (both under the GIL); the calls in flight on other
  // threads finish before the library's close frees what they use.
  void close() {
    Handle* h = std::exchange(handle_, nullptr);
    if (h == nullptr) return;
    py::gil_scoped_release unlocked;
    std::unique_lock<std::mutex> lock(calls_mutex_);
    calls_done_.wait(lock, [&] { return in_flight_ == 0; });
    lock.unlock();
    Api::close(h);
  }
  const Caps& caps() const { return caps_; }
  bool open() const { return handle_ != nullptr; }

  int64_t open_session() {
    tpdraft_session s = -1;
    call([&](Handle* h) { return Api::open_session(h, &s); });
    return s;
  }
  void close_session(int64_t s) {
    call([&](Handle* h) { return Api::close_session(h, s); });
  }
  py::dict last_times() {
    tpdraft_step_times t{};
    raise_for(Api::times(live(), &t));
    return py::dict("settle"_a = t.settle_seconds, "draft"_a = t.draft_seconds, "total"_a = t.total_seconds);
  }
  int64_t session_length(int64_t s) {
    int64_t n = 0;
    call([&](Handle* h) { return Api::length(h, s, &n); });
    return n;
  }

  py::list step(const py::list& entries, const std::string& out_kind) {
    if (out_kind != "numpy" && out_kind != "torch")
      throw py::value_error("out is '" + out_kind + "', expected 'numpy' or 'torch'");
    std::vector<Staged> staged(entries.size());
    std::vector<tpdraft_step_entry> raw(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!py::isinstance<py::dict>(entries[i]))
        throw py::type_error("entry " + std::to_string(i) + " must be a dict, got " +
                             py::repr(entries[i]).cast<std::string>());
      stage(entries[i].cast<py::dict>(), raw[i], &staged[i]);
    }
    call([&](Handle* h) {
      const auto t0 = std::chrono::steady_clock::now();
      const tpdraft_status st = Api::step(h, raw.data(), raw.size());
      last_step_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return st;
    });
    // Torch results go where the step's device taps were, else to the drafter's device.
    int device = -1;
    if (out_kind == "torch") {
      for (const Staged& s : staged) device = std::max(device, s.tensor.device);
      if (device == -1 && caps_.backend == "cuda") device = -2;
    }
    const auto result = [&](const py::array& a) -> py::object {
      return out_kind == "torch" ? tpdraft_python::to_torch(a, device) : py::object(a);
    };
    py::list out;
    for (size_t i = 0; i < staged.size(); ++i) {
      const Staged& s = staged[i];
      py::dict r("tokens"_a = result(s.tokens), "q"_a = result(s.q));
      if (raw[i].dist_width != 0) {
        r["dist_probs"] = result(s.dist_probs);
        if (raw[i].dist_width > 0) {
          r["dist_ids"] = result(s.dist_ids);
          r["dist_rest"] = result(s.dist_rest);
        }
      }
      out.append(std::move(r));
    }
    return out;
  }

 protected:
  void set_handle(Handle* h) {
    handle_ = h;
    tpdraft_caps c{sizeof c};
    raise_for(Api::caps(handle_, &c));
    caps_ = {c.architecture, c.backend, c.block_size, c.tp, c.max_sessions, c.max_open_sessions,
             c.taps_width, c.hidden_size, c.vocab_size, c.mask_token_id, c.max_context, c.draft_vocab_size,
             std::vector<int64_t>(c.target_layer_ids, c.target_layer_ids + c.n_target_layers)};
  }
  Handle* live() const {
    if (handle_ == nullptr) throw py::value_error(Api::closed);
    return handle_;
  }
  // Runs f(handle), a library call, without the GIL; close() waits for it. Raises its failure.
  template <typename F>
  void call(F&& f) {
    Handle* h = live();  // with the GIL held, as close() clears the handle
    {
      std::lock_guard<std::mutex> lock(calls_mutex_);
      ++in_flight_;
    }
    call_unlocked([&] {
      const tpdraft_status st = f(h);
      std::lock_guard<std::mutex> lock(calls_mutex_);
      if (--in_flight_ == 0) calls_done_.notify_all();
      return st;
    });
  }

 private:
  // Taps: C-contiguous f32 / f16 / bf16 (uint16) are read in place; anything else is converted
  // to C-contiguous f32 once.
  void stage_taps(const py::dict& e, tpdraft_step_entry& t, Staged* s) {
    const std::string label = get<std::string>(e, "taps_dtype", "");
    if (!label.empty() && label != "bf16")
      throw py::value_error("taps_dtype is '" + label + "'; the only label is 'bf16' (uint16 arrays holding bf16 bits): "
                            "f32 and f16 arrays say their dtype themselves");
    if (!e.contains("taps") || e["taps"].is_none()) {
      if (!label.empty()) throw py::value_error("taps_dtype given without taps");
      return;
    }
    const py::object taps = e["taps"];
    if (label.empty() && !py::isinstance<py::array>(taps) &&
        tpdraft_python::read_tensor_taps(taps, e.contains("stream") ? py::object(e["stream"]) : py::none(),
                                         Api::served ? "served" : caps_.backend, caps_.taps_width, t, &s->tensor))
      return;
    py::array a = py::array::ensure(taps);
    if (!a) throw py::type_error("entry 'taps' must be an array [n_new, taps_width]");
    // Only real floating-point values are hidden states; anything else would be cast silently.
    const char kind = a.dtype().kind();
    if (label.empty() && kind != 'f')
      throw py::type_error("entry 'taps' must hold floats (f32, f16; bf16 bits as uint16 with taps_dtype='bf16'), got "
                           "dtype " + py::str(a.dtype()).cast<std::string>());
    const bool contiguous = (a.flags() & py::array::c_style) != 0;
    if (label == "bf16") {
      if (!a.dtype().is(py::dtype::of<uint16_t>()) || !contiguous)
        throw py::type_error("taps_dtype 'bf16' needs a C-contiguous uint16 array holding the bf16 bits");
      t.taps_dtype = TPDRAFT_BF16;
    } else if (a.dtype().is(py::dtype::of<float>()) && contiguous) {
      t.taps_dtype = TPDRAFT_F32;
    } else if (a.dtype().is(py::dtype("float16")) && contiguous) {
      t.taps_dtype = TPDRAFT_F16;
    } else {
      a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
      if (!a) throw py::type_error("entry 'taps' cannot be read as f32");
      t.taps_dtype = TPDRAFT_F32;
    }
    if (a.ndim() != 2 || a.shape(1) != caps_.taps_width)
      throw py::value_error("entry 'taps' must be [n_new, " + std::to_string(caps_.taps_width) + "]");
    s->taps = a;
    t.taps = a.data();
    t.n_new = a.shape(0);
  }

  void stage(const py::dict& e, tpdraft_step_entry& t, Staged* s) {
    check_entry_keys(e);
    if (!e.contains("session") || !e.contains("anchor")) throw py::key_error("an entry needs 'session' and 'anchor'");
    t.session = get<int64_t>(e, "session", -1);
    t.anchor = get<int64_t>(e, "anchor", -1);
    t.keep = get<int64_t>(e, "keep", -1);
    t.p0 = get<int64_t>(e, "p0", -1);
    t.sampling = {get<double>(e, "temperature", 0.0), get<int64_t>(e, "top_k", 0), get<double>(e, "top_p", 1.0),
                  get<uint64_t>(e, "seed", 0)};
    stage_taps(e, t, s);
    if (e.contains("dist") && py::isinstance<py::str>(e["dist"])) {
      const std::string dist = e["dist"].cast<std::string>();
      if (dist != "full") throw py::value_error("entry 'dist' is '" + dist + "': a width (an integer) or 'full'");
      t.dist_width = TPDRAFT_DIST_FULL;
    } else {
      t.dist_width = get<int64_t>(e, "dist", 0);
    }
    const py::ssize_t rows = caps_.block_size - 1;
    s->tokens = py::array_t<int64_t>(rows);
    s->q = py::array_t<float>(rows);
    t.tokens = s->tokens.mutable_data();
    t.q = s->q.mutable_data();
    if (t.dist_width == 0) return;
    const py::ssize_t width = t.dist_width > 0 ? t.dist_width : caps_.vocab_size;
    s->dist_probs = py::array_t<float>({rows, width});
    t.dist_probs = s->dist_probs.mutable_data();
    if (t.dist_width < 0) return;
    s->dist_ids = py::array_t<int64_t>({rows, width});
    s->dist_rest = py::array_t<float>(rows);
    t.dist_ids = s->dist_ids.mutable_data();
    t.dist_rest = s->dist_rest.mutable_data();
  }

  Handle* handle_ = nullptr;
  Caps caps_;
  std::mutex calls_mutex_;
  std::condition_variable calls_done_;
  int in_flight_ = 0;  // library calls running on other threads

 public:
  // Seconds the last step spent inside the library's step call: a caller's wall time minus this
  // is what Python and the module added.
  double last_step_seconds_ = 0;
};

// A token map given as ids: a 1-D sequence or array of integers (not bools, not floats).
py::array_t<int64_t> token_ids(const py::object& ids) {
  // numpy would take True in a list of ints as the id 1.
  if (py::isinstance<py::list>(ids) || py::isinstance<py::tuple>(ids))
    for (const py::handle item : ids)
      if (py::isinstance<py::bool_>(item)) throw py::type_error("token_map holds a bool; give integer target ids");
  py::array a;
  try {
    a = py::module_::import("numpy").attr("asarray")(ids);
  } catch (const py::error_already_set&) {
    throw py::type_error("token_map must be a path or a sequence of integer target ids");
  }
  if (a.size() == 0) throw py::value_error("token_map is empty: give at least one target id");
  const char kind = a.dtype().kind();
  if (a.ndim() != 1 || (kind != 'i' && kind != 'u'))
    throw py::type_error("token_map must be a path or a 1-D sequence of integer target ids, got an array of dtype " +
                         py::str(a.dtype()).cast<std::string>() + " and " + std::to_string(a.ndim()) + " dimension(s)");
  // An unsigned id beyond int64 would wrap to a negative one in the cast below: name it as given.
  if (kind == 'u') {
    const py::object top = a.attr("max")();
    if (top.cast<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw py::value_error("token_map holds the target id " + py::str(top).cast<std::string>() +
                            ", beyond any vocabulary");
  }
  return py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
}

// An optional flag: None (the library decides), True or False; anything else is a TypeError.
int32_t tri_state(const py::object& v, const char* name) {
  if (v.is_none()) return -1;
  if (!py::isinstance<py::bool_>(v))
    throw py::type_error(std::string(name) + " must be None, True or False, got " + py::repr(v).cast<std::string>());
  return v.cast<bool>() ? 1 : 0;
}

// A string the C library reads up to its first NUL: one holding a NUL would be read cut short.
const std::string& whole_string(const std::string& s, const char* name) {
  if (s.find('\0') != std::string::npos)
    throw py::value_error(std::string(name) + " holds a NUL character: " + py::repr(py::str(s)).cast<std::string>());
  return s;
}

// An optional name: "" for None (the library's default), else the str; anything else is a
// TypeError saying what `name` must be.
std::string optional_name(const py::object& v, const char* name, const char* must_be) {
  if (v.is_none()) return {};
  if (!py::isinstance<py::str>(v))
    throw py::type_error(std::string(name) + " must be " + must_be + ", got " + py::repr(v).cast<std::string>());
  return whole_string(v.cast<std::string>(), name);
}

// A str or os.PathLike as the path it names; anything else is a TypeError saying what `name` must be.
std::string path_or_str(const py::object& v, const char* name, const char* must_be) {
  if (!py::isinstance<py::str>(v) && !py::hasattr(v, "__fspath__"))
    throw py::type_error(std::string(name) + " must be " + must_be + ", got " + py::repr(v).cast<std::string>());
  return whole_string(py::module_::import("os").attr("fspath")(v).cast<std::string>(), name);
}

class Drafter : public Endpoint<InProcess> {
 public:
  Drafter(const std::string& drafter_dir, const std::string& target_dir, const std::string& backend, int threads,
          int tp, int max_sessions, int64_t max_context, int max_open_sessions, py::object graphs, py::object quant,
          py::object token_map, py::object kv_dtype) {
    whole_string(drafter_dir, "drafter_dir");
    whole_string(target_dir, "target_dir");
    whole_string(backend, "backend");
    tpdraft_options o;
    tpdraft_options_init(&o);
    o.backend = backend.c_str();
    o.threads = threads;
    o.tp = tp;
    o.max_sessions = max_sessions;
    o.max_context = max_context;
    o.max_open_sessions = max_open_sessions;
    o.graphs = tri_state(graphs, "graphs");
    const std::string quant_name = optional_name(quant, "quant",
                                                  "None or one of 'q8', 'q4', 'q8a8', 'q4a8', 'q8a16', 'q4a16', "
                                                  "each with or without '+head'");
    o.quant = quant.is_none() ? nullptr : quant_name.c_str();
    const std::string kv_name = optional_name(kv_dtype, "kv_dtype", "None, 'f32' or 'bf16'");
    o.kv_dtype = kv_dtype.is_none() ? nullptr : kv_name.c_str();
    // A path (str or os.PathLike) to a token map file, or the target ids themselves.
    std::string map_path;
    py::array_t<int64_t> map_ids;
    if (!token_map.is_none()) {
      if (py::isinstance<py::str>(token_map) || py::hasattr(token_map, "__fspath__")) {
        map_path = path_or_str(token_map, "token_map", "a str or a path");
        o.token_map = map_path.c_str();
      } else {
        map_ids = token_ids(token_map);
        o.token_ids = map_ids.data();
        o.n_token_ids = map_ids.size();
      }
    }
    tpdraft_drafter* h = nullptr;
    call_unlocked([&] { return tpdraft_open(drafter_dir.c_str(), target_dir.c_str(), &o, &h); });
    set_handle(h);
  }
};

class Client : public Endpoint<Served> {
 public:
  Client(const std::string& address, double timeout, py::object shared_memory, int64_t ring_bytes,
         py::object server_key) {
    tpdraft_client_options o;
    tpdraft_client_options_init(&o);
    whole_string(address, "address");
    std::string key;
    if (!server_key.is_none()) {
      key = path_or_str(server_key, "server_key", "a str (the key, or the file holding it) or a path");
      o.server_key = key.c_str();
    }
    o.timeout_seconds = timeout;
    o.shared_memory = tri_state(shared_memory, "shared_memory");
    if (ring_bytes < 0) throw py::value_error("ring_bytes is " + std::to_string(ring_bytes) + ", expected 0 (the "
                                              "default size) or a size in bytes");
    if (ring_bytes > 0) o.ring_bytes = ring_bytes;
    tpdraft_client* h = nullptr;
    call_unlocked([&] { return tpdraft_client_open(address.c_str(), &o, &h); });
    set_handle(h);
    shared_memory_ = tpdraft_client_shared_memory(h) != 0;
  }
  bool shared_memory() const { return shared_memory_; }
  py::dict stats() {
    tpdraft_server_stats s{};
    call([&](tpdraft_client* h) { return tpdraft_client_stats(h, &s); });
    return py::dict("clients"_a = s.clients, "open_sessions"_a = s.open_sessions, "forwards"_a = s.forwards,
                    "steps"_a = s.steps, "entries"_a = s.entries, "errors"_a = s.errors, "max_batch"_a = s.max_batch,
                    "clients_reaped"_a = s.clients_reaped, "uptime_seconds"_a = s.uptime_seconds);
  }
  void shutdown() {
    call([](tpdraft_client* h) { return tpdraft_client_shutdown(h); });
  }

 private:
  bool shared_memory_ = false;
};

// The calls Drafter and Client share; the docs say where each one's step runs.
template <typename T>
void def_endpoint(py::class_<T>& cls, const char* step_doc, const char* seconds_doc, const char* times_doc) {
  cls.def_property_readonly("caps", &T::caps)
      .def("open_session", &T::open_session)
      .def("close_session", &T::close_session, py::arg("session"))
      .def("session_length", &T::session_length, py::arg("session"))
      .def("step", &T::step, py::arg("entries"), py::kw_only(), py::arg("out") = "numpy", step_doc)
      .def_readonly("last_step_seconds", &T::last_step_seconds_, seconds_doc)
      .def_property_readonly("last_times", &T::last_times, times_doc)
      .def("close", &T::close)
      .def("__enter__", [](T& x) -> T& { return x; }, py::return_value_policy::reference)
      .def("__exit__", [](T& x, py::object, py::object, py::object) { x.close(); })
      .def("__repr__", [](const T& x) {
        const std::string name = std::string("<tpdraft.") + (std::is_same_v<T, Drafter> ? "Drafter" : "Client");
        if (!x.open()) return name + " (closed)>";
        const Caps& c = x.caps();
        return name + " " + c.architecture + " on " + c.backend + ", tp " + std::to_string(c.tp) + ", block " +
               std::to_string(c.block_size) + ", taps_width " + std::to_string(c.taps_width) + ">";
      });
}

// The host's log callback: a Python callable taking (level, line), kept for the interpreter's
// life. Read and replaced with the GIL held; the library calls forward_log_line without it.
py::object* g_log_callback = nullptr;
const char* const kLogLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

void forward_log_line(int level, const char* line, void*) {
#if PY_VERSION_HEX >= 0x030D0000
  if (!Py_IsInitialized() || Py_IsFinalizing()) return;
#else
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
#endif
  py::gil_scoped_acquire gil;
  if (g_log_callback->is_none()) return;
  try {
    (*g_log_callback)(kLogLevels[std::clamp(level, 0, 6)], line);
  } catch (py::error_already_set& e) {
    // A raising callback must not take the library's thread down: Python reports it (sys.unraisablehook).
    e.discard_as_unraisable("tpdraft's log callback");
  }
}

void set_log_callback(const py::object& callback) {
  if (!callback.is_none() && !PyCallable_Check(callback.ptr()))
    throw py::type_error("set_log_callback takes a callable (level, line) or None, got " +
                         py::repr(callback).cast<std::string>());
  py::object previous = std::exchange(*g_log_callback, callback);
  tpdraft_status st;
  {
    // A line being logged on another thread holds the library's sink while it waits for the GIL.
    py::gil_scoped_release unlocked;
    st = tpdraft_set_log_callback(callback.is_none() ? nullptr : forward_log_line, nullptr);
  }
  if (st != TPDRAFT_OK) *g_log_callback = std::move(previous);
  raise_for(st);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "DFlash / DFlash 2 drafters for speculative decoding (tpdraft's C library)";
  m.attr("__version__") = tpdraft_version();
  // Each class is tpdraft.NAME, set on the module; the globals keep a reference of their own for raise_for().
  g_error = py::exception<void>(m, "Error", PyExc_RuntimeError).release().ptr();
  // An argument error is a ValueError too, so that code catching ValueError sees it.
  const py::tuple bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_argument_error = py::exception<void>(m, "ArgumentError", bases).release().ptr();
  g_input_error = py::exception<void>(m, "InputError", g_error).release().ptr();
  g_unavailable_error = py::exception<void>(m, "UnavailableError", g_error).release().ptr();
  // Busy is unavailable for now (an engine decodes the step without drafts either way), but the
  // client stays open.
  g_busy_error = py::exception<void>(m, "BusyError", g_unavailable_error).release().ptr();

  py::class_<Caps> caps(m, "Caps", "What a caller needs to know to drive the drafter");
#define X(field) caps.def_readonly(#field, &Caps::field);
  TPDRAFT_CAPS_FIELDS(X)
#undef X
  caps.def("__repr__", [](const Caps& c) {
    std::string out;
#define X(field) \
  out += (out.empty() ? "Caps(" : ", ") + std::string(#field "=") + py::repr(py::cast(c.field)).cast<std::string>();
    TPDRAFT_CAPS_FIELDS(X)
#undef X
    return out + ")";
  });

  g_log_callback = new py::object(py::none());
  m.def("set_log_level", [](const std::string& level) { raise_for(tpdraft_set_log_level(whole_string(level, "level").c_str())); },
        py::arg("level"),
        "The library's log level for this process: trace, debug, info, warn, error, critical or off (any case). "
        "Until set, TPDRAFT_LOG_LEVEL, else warn: the library prints only warnings and errors.");
  m.def("set_log_callback", &set_log_callback, py::arg("callback"),
        "callback(level, line) receives each log line (level: 'trace' ... 'critical'; line: without its newline) "
        "instead of stderr, on the thread that logs it; None: back to stderr. An exception it raises goes to "
        "sys.unraisablehook.");
  // Lines logged while the interpreter exits go to stderr, not to a callable being torn down.
  py::module_::import("atexit").attr("register")(py::cpp_function([] { set_log_callback(py::none()); }));

  py::class_<Drafter> drafter(m, "Drafter",
                              "A drafter in this process (__init__ has the options). kv_dtype: None or 'f32', or "
                              "'bf16' (the context cache in bf16, cpu backend only); quant: None, 'q8' or 'q4', "
                              "optionally with 'a8' or 'a16' (int8 or float activations) and '+head' (quantize a float "
                              "checkpoint while loading; +head: the target's head too); "
                              "token_map: a token map file (JSON list of target ids, or safetensors with 'token_ids') "
                              "or a sequence of target ids: draft over those ids only");
  drafter.def(py::init<const std::string&, const std::string&, const std::string&, int, int, int, int64_t, int,
                       py::object, py::object, py::object, py::object>(),
              py::arg("drafter_dir"), py::arg("target_dir"), py::kw_only(), py::arg("backend") = "auto",
              py::arg("threads") = 0, py::arg("tp") = 1, py::arg("max_sessions") = 8, py::arg("max_context") = 4096,
              py::arg("max_open_sessions") = 64, py::arg("graphs") = py::none(), py::arg("quant") = py::none(),
              py::arg("token_map") = py::none(), py::arg("kv_dtype") = py::none());
  def_endpoint(drafter,
               "entries: dicts with session, anchor and optionally taps [n_new, taps_width] (a numpy array of f32, "
               "f16, or uint16 with taps_dtype='bf16'; or a tensor with DLPack or __cuda_array_interface__ of f32, "
               "f16 or bf16, on the host or, for a cuda drafter, on its GPU), stream (device taps: the CUDA stream "
               "they were written on; default: torch's current stream), keep, p0, temperature, top_k, top_p, seed, "
               "dist (w or 'full'). Returns one dict per entry: tokens [B-1] int64, q [B-1] float32, and dist_ids / "
               "dist_probs / dist_rest when asked; numpy arrays, or torch tensors with out='torch' (on the GPU of "
               "the device taps, or of a cuda drafter).",
               "Seconds the last step spent inside the C library (tpdraft_step)",
               "Where the last step's time went (seconds): settle, draft, total (inside the library)");

  py::class_<Client> client(m, "Client",
                            "A drafter served by `tpdraft serve` at address (ipc://PATH or tcp://HOST:PORT), with "
                            "the calls of Drafter. A call the server does not answer within timeout seconds raises "
                            "UnavailableError and closes the client; a step the server's full queue did not take "
                            "raises BusyError (an UnavailableError) and leaves it open. shared_memory: taps through a "
                            "shared-memory ring (None: for ipc:// addresses). server_key: the public CURVE key of a "
                            "server started with --curve-secret-key (the key, or the NAME.public file of tpdraft "
                            "keys).");
  client.def(py::init<const std::string&, double, py::object, int64_t, py::object>(), py::arg("address"),
             py::kw_only(), py::arg("timeout") = 10.0, py::arg("shared_memory") = py::none(), py::arg("ring_bytes") = 0,
             py::arg("server_key") = py::none())
      .def_property_readonly("shared_memory", &Client::shared_memory, "Whether taps go through the shared-memory ring")
      .def("stats", &Client::stats, "The server's counters (STATS)")
      .def("shutdown", &Client::shutdown, "Ask the server to stop after the forward in flight");
  def_endpoint(client, "As Drafter.step, answered by the server",
               "Seconds the last step spent inside tpdraft_client_step (the round trip to the server included)",
               "The last step: settle and draft (the server's forward), total (the whole call here)");
}
