// Encoding and bounds-checked decoding of the serve protocol's frames.
#include "serve/protocol.h"

namespace tpdraft::serve {

const char* kind_name(uint16_t kind) {
  // By the kinds' values, kHello = 1 to kBell = 9.
  static const char* const names[] = {"unknown", "HELLO", "OPEN", "CLOSE", "STEP", "STATS", "SHUTDOWN", "LENGTH",
                                      "BYE", "BELL"};
  const size_t k = kind & ~kReply;
  return k < std::size(names) ? names[k] : "unknown";
}

namespace {

// Each message's fixed fields in wire order, with the names a decoding error gives them: the
// encoder and the decoder walk the same list, so the two cannot drift apart.
template <typename H, typename F>
void header_fields(H& h, F&& f) {
  f(h.magic, "header.magic"); f(h.version, "header.version"); f(h.kind, "header.kind");
  f(h.status, "header.status"); f(h.count, "header.count"); f(h.id, "header.id");
}

template <typename E, typename F>
void entry_fields(E& e, F&& f) {
  f(e.session, "entry.session"); f(e.keep, "entry.keep"); f(e.p0, "entry.p0"); f(e.n_new, "entry.n_new");
  f(e.anchor, "entry.anchor"); f(e.dist_width, "entry.dist_width"); f(e.top_k, "entry.top_k");
  f(e.temperature, "entry.temperature"); f(e.top_p, "entry.top_p"); f(e.seed, "entry.seed");
  f(e.taps_dtype, "entry.taps_dtype"); f(e.taps_where, "entry.taps_where");
  f(e.taps_offset, "entry.taps_offset"); f(e.taps_bytes, "entry.taps_bytes");
}

template <typename C, typename F>
void caps_numbers(C& c, F&& f) {
  f(c.block, "caps.block_size"); f(c.tp, "caps.tp"); f(c.taps_width, "caps.taps_width");
  f(c.hidden, "caps.hidden_size"); f(c.vocab, "caps.vocab_size"); f(c.mask_token, "caps.mask_token_id");
  f(c.max_sessions, "caps.max_sessions"); f(c.max_open_sessions, "caps.max_open_sessions");
  f(c.max_context, "caps.max_context"); f(c.draft_vocab, "caps.draft_vocab_size");
}

template <typename S, typename F>
void stats_fields(S& s, F&& f) {
  f(s.clients, "stats.clients"); f(s.open_sessions, "stats.open_sessions"); f(s.forwards, "stats.forwards");
  f(s.steps, "stats.steps"); f(s.entries, "stats.entries"); f(s.errors, "stats.errors");
  f(s.max_batch, "stats.max_batch"); f(s.clients_reaped, "stats.clients_reaped");
  f(s.uptime_seconds, "stats.uptime_seconds");
}

struct Put {
  Writer& w;
  template <typename T>
  void operator()(const T& v, const char*) const { w.put(v); }
};

struct Get {
  Reader& r;
  template <typename T>
  void operator()(T& v, const char* field) const { v = r.get<T>(field); }
};

}  // namespace

void Writer::header(const Header& h) { header_fields(h, Put{*this}); }

void Reader::need(size_t n, const char* field) const {
  if (n > size_ - at_)
    throw ProtocolError(fmt::format("the frame ends inside {} (needs {} bytes at offset {}, the frame has {})", field,
                                    n, at_, size_));
}

std::string Reader::str(const char* field, size_t max) {
  const uint32_t n = get<uint32_t>(field);
  if (n > max) throw ProtocolError(fmt::format("{} is {} bytes long, at most {} are allowed", field, n, max));
  return std::string(bytes(n, field), n);
}

Header Reader::header() {
  if (size_ < kHeaderBytes)
    throw ProtocolError(fmt::format("a frame of {} bytes is shorter than the {}-byte header", size_, kHeaderBytes));
  Header h;
  header_fields(h, Get{*this});
  if (h.magic != kMagic)
    throw ProtocolError(fmt::format("header.magic is {:#010x}, expected {:#010x} (\"TPD1\")", h.magic, kMagic));
  return h;
}

void put_entry(Writer& w, const WireEntry& e) { entry_fields(e, Put{w}); }

WireEntry get_entry(Reader& r) {
  WireEntry e;
  entry_fields(e, Get{r});
  return e;
}

Header reply_header(const Header& request, uint32_t status, uint32_t count) {
  Header h;
  h.kind = static_cast<uint16_t>(request.kind | kReply);
  h.status = status;
  h.count = count;
  h.id = request.id;
  return h;
}

std::string error_reply(const Header& request, uint32_t status, const std::string& message) {
  std::string out;
  Writer w(&out);
  w.header(reply_header(request, status));
  w.str(message.size() > 4000 ? message.substr(0, 4000) : message);
  return out;
}

void put_caps(Writer& w, const WireCaps& c) {
  w.str(c.architecture);
  w.str(c.backend);
  caps_numbers(c, Put{w});
  w.put<uint32_t>(static_cast<uint32_t>(c.target_layers.size()));
  for (int64_t l : c.target_layers) w.put(l);
}

WireCaps get_caps(Reader& r) {
  WireCaps c;
  c.architecture = r.str("caps.architecture");
  c.backend = r.str("caps.backend");
  caps_numbers(c, Get{r});
  const uint32_t n = r.get<uint32_t>("caps.n_target_layers");
  if (n > 4096) throw ProtocolError(fmt::format("caps.n_target_layers is {}, at most 4096", n));
  for (uint32_t i = 0; i < n; ++i) c.target_layers.push_back(r.get<int64_t>("caps.target_layer_ids"));
  return c;
}

void put_stats(Writer& w, const WireStats& s) { stats_fields(s, Put{w}); }

WireStats get_stats(Reader& r) {
  WireStats s;
  stats_fields(s, Get{r});
  return s;
}

}  // namespace tpdraft::serve
