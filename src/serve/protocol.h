// The wire format of `tpdraft serve` (docs/protocol.md): every message is one ZeroMQ frame (the
// server's ROUTER adds the client's routing frame) holding a fixed 24-byte header and a body of
// little-endian integers, doubles and raw arrays. Both ends use these helpers; every read is
// bounds-checked and names the field it could not read, so a malformed frame becomes an error
// reply, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "engine/engine.h"
#include "tpdraft/tpdraft.h"

namespace tpdraft::serve {

constexpr uint32_t kMagic = 0x31445054;  // the bytes "TPD1"
constexpr uint16_t kProtocolVersion = 2;
constexpr size_t kHeaderBytes = 24;
constexpr size_t kEntryBytes = 104;  // one STEP entry on the wire

// Request kinds; a reply carries the request's kind | kReply.
enum Kind : uint16_t {
  kHello = 1,
  kOpen = 2,
  kClose = 3,
  kStep = 4,
  kStats = 5,
  kShutdown = 6,
  kLength = 7,
  kBye = 8,
  kBell = 9,  // a doorbell: a request waits in the client's ring (no reply)
};
constexpr uint16_t kReply = 0x100;
const char* kind_name(uint16_t kind);

// Reply status: 0 ok, else what kind of failure (the body is then the message). 2 is never sent
// (the server's own inputs are checked at start); a client reads it as a runtime failure.
enum WireStatus : uint32_t {
  kOk = 0,
  kArgument = 1,   // a wrong request or entry, a limit: nothing changed
  kRuntime = 3,    // the drafter failed while working; the server ends
  kMalformed = 4,  // the frame cannot be read (size, magic, version, a field)
  kClosing = 5,    // the server is shutting down: the request was not run
  kBusy = 6,       // the server's queue of STEPs is full: the request was not taken; ask again
};

// Where an entry's taps are.
enum TapsWhere : uint32_t { kTapsNone = 0, kTapsInline = 1, kTapsRing = 2 };

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t kind = 0;
  uint32_t status = 0;
  uint32_t count = 0;  // STEP: entries; otherwise 0
  uint64_t id = 0;     // the client's request number, echoed by the reply
};

// A malformed frame: the message says which field.
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& what) : Error(what) {}
};

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    static_assert(std::is_arithmetic<T>::value, "numbers only");
    out_->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void bytes(const void* data, size_t n) { out_->append(static_cast<const char*>(data), n); }
  void str(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void header(const Header& h);

 private:
  std::string* out_;
};

class Reader {
 public:
  Reader(const void* data, size_t size) : p_(static_cast<const char*>(data)), size_(size) {}
  template <typename T>
  T get(const char* field) {
    static_assert(std::is_arithmetic<T>::value, "numbers only");
    T v;
    std::memcpy(&v, bytes(sizeof(T), field), sizeof(T));
    return v;
  }
  // A pointer to n bytes in place (no copy).
  const char* bytes(size_t n, const char* field) {
    need(n, field);
    const char* q = p_ + at_;
    at_ += n;
    return q;
  }
  std::string str(const char* field, size_t max = 4096);
  Header header();
  size_t left() const { return size_ - at_; }
  const char* rest() const { return p_ + at_; }  // the left() bytes not read yet, in place

 private:
  void need(size_t n, const char* field) const;
  const char* p_;
  size_t size_;
  size_t at_ = 0;
};

// One STEP entry as it travels (the C ABI's tpdraft_step_entry without the output buffers).
struct WireEntry {
  int64_t session = 0, keep = -1, p0 = -1, n_new = 0, anchor = 0, dist_width = 0, top_k = 0;
  double temperature = 0, top_p = 1;
  uint64_t seed = 0;
  uint32_t taps_dtype = 0;  // 0 f32, 1 bf16, 2 f16 (as tpdraft_dtype)
  uint32_t taps_where = kTapsNone;
  uint64_t taps_offset = 0;  // inline: from the start of the taps area; ring: from the ring's start
  uint64_t taps_bytes = 0;
};
void put_entry(Writer& w, const WireEntry& e);
WireEntry get_entry(Reader& r);

// The element type of a wire taps dtype code known to be valid (dtype_bytes(code) != 0).
inline DType wire_dtype(uint32_t code) { return code == 0 ? DType::F32 : code == 1 ? DType::BF16 : DType::F16; }

// Bytes of one element of a wire taps dtype (0 when the code is unknown).
inline size_t dtype_bytes(uint32_t code) { return code == 0 ? 4 : code == 1 || code == 2 ? 2 : 0; }

// The header of the reply to `request`: its kind | kReply, its id, and `status` and `count`.
Header reply_header(const Header& request, uint32_t status = kOk, uint32_t count = 0);
// Replies: an error reply is a header with a status and the message as the body.
std::string error_reply(const Header& request, uint32_t status, const std::string& message);

// The caps as HELLO's reply carries them: the engine's, and the name of its backend.
struct WireCaps : engine::Caps {
  std::string backend;
};
void put_caps(Writer& w, const WireCaps& c);
WireCaps get_caps(Reader& r);

// STATS' reply body: the C ABI's server stats, field for field.
using WireStats = tpdraft_server_stats;
void put_stats(Writer& w, const WireStats& s);
WireStats get_stats(Reader& r);

}  // namespace tpdraft::serve
