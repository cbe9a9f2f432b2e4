// Encoding and bounds-checked decoding of the serve protocol's frames.
#include "serve/protocol.h"

namespace tpdraft::serve {

const char* kind_name(uint16_t kind) {
  switch (kind & ~kReply) {
    case kHello: return "HELLO";
    case kOpen: return "OPEN";
    case kClose: return "CLOSE";
    case kStep: return "STEP";
    case kStats: return "STATS";
    case kShutdown: return "SHUTDOWN";
    case kLength: return "LENGTH";
    case kBye: return "BYE";
    case kBell: return "BELL";
  }
  return "unknown";
}

void Writer::header(const Header& h) {
  put(h.magic);
  put(h.version);
  put(h.kind);
  put(h.status);
  put(h.count);
  put(h.id);
}

void Reader::need(size_t n, const char* field) const {
  if (n > size_ - at_)
    throw ProtocolError(fmt::format("the frame ends inside {} (needs {} bytes at offset {}, the frame has {})", field,
                                    n, at_, size_));
}

std::string Reader::str(const char* field, size_t max) {
  const uint32_t n = get<uint32_t>(field);
  if (n > max) throw ProtocolError(fmt::format("{} is {} bytes long, at most {} are allowed", field, n, max));
  const char* s = bytes(n, field);
  return std::string(s, n);
}

Header Reader::header() {
  Header h;
  if (size_ < kHeaderBytes)
    throw ProtocolError(fmt::format("a frame of {} bytes is shorter than the {}-byte header", size_, kHeaderBytes));
  h.magic = get<uint32_t>("header.magic");
  if (h.magic != kMagic)
    throw ProtocolError(fmt::format("header.magic is {:#010x}, expected {:#010x} (\"TPD1\")", h.magic, kMagic));
  h.version = get<uint16_t>("header.version");
  h.kind = get<uint16_t>("header.kind");
  h.status = get<uint32_t>("header.status");
  h.count = get<uint32_t>("header.count");
  h.id = get<uint64_t>("header.id");
  return h;
}

void put_entry(Writer& w, const WireEntry& e) {
  w.put(e.session);
  w.put(e.keep);
  w.put(e.p0);
  w.put(e.n_new);
  w.put(e.anchor);
  w.put(e.dist_width);
  w.put(e.top_k);
  w.put(e.temperature);
  w.put(e.top_p);
  w.put(e.seed);
  w.put(e.taps_dtype);
  w.put(e.taps_where);
  w.put(e.taps_offset);
  w.put(e.taps_bytes);
}

WireEntry get_entry(Reader& r) {
  WireEntry e;
  e.session = r.get<int64_t>("entry.session");
  e.keep = r.get<int64_t>("entry.keep");
  e.p0 = r.get<int64_t>("entry.p0");
  e.n_new = r.get<int64_t>("entry.n_new");
  e.anchor = r.get<int64_t>("entry.anchor");
  e.dist_width = r.get<int64_t>("entry.dist_width");
  e.top_k = r.get<int64_t>("entry.top_k");
  e.temperature = r.get<double>("entry.temperature");
  e.top_p = r.get<double>("entry.top_p");
  e.seed = r.get<uint64_t>("entry.seed");
  e.taps_dtype = r.get<uint32_t>("entry.taps_dtype");
  e.taps_where = r.get<uint32_t>("entry.taps_where");
  e.taps_offset = r.get<uint64_t>("entry.taps_offset");
  e.taps_bytes = r.get<uint64_t>("entry.taps_bytes");
  return e;
}

size_t dtype_bytes(uint32_t code) {
  switch (code) {
    case 0: return 4;
    case 1: return 2;
    case 2: return 2;
  }
  return 0;
}

std::string error_reply(const Header& request, uint32_t status, const std::string& message) {
  std::string out;
  Writer w(&out);
  Header h;
  h.kind = static_cast<uint16_t>(request.kind | kReply);
  h.status = status;
  h.id = request.id;
  w.header(h);
  w.str(message.size() > 4000 ? message.substr(0, 4000) : message);
  return out;
}

void put_caps(Writer& w, const WireCaps& c) {
  w.str(c.architecture);
  w.str(c.backend);
  for (int64_t v : {c.block, c.tp, c.taps_width, c.hidden, c.vocab, c.mask_token, c.max_sessions,
                    c.max_open_sessions, c.max_context})
    w.put(v);
  w.put<uint32_t>(static_cast<uint32_t>(c.target_layers.size()));
  for (int64_t l : c.target_layers) w.put(l);
}

WireCaps get_caps(Reader& r) {
  WireCaps c;
  c.architecture = r.str("caps.architecture");
  c.backend = r.str("caps.backend");
  c.block = r.get<int64_t>("caps.block_size");
  c.tp = r.get<int64_t>("caps.tp");
  c.taps_width = r.get<int64_t>("caps.taps_width");
  c.hidden = r.get<int64_t>("caps.hidden_size");
  c.vocab = r.get<int64_t>("caps.vocab_size");
  c.mask_token = r.get<int64_t>("caps.mask_token_id");
  c.max_sessions = r.get<int64_t>("caps.max_sessions");
  c.max_open_sessions = r.get<int64_t>("caps.max_open_sessions");
  c.max_context = r.get<int64_t>("caps.max_context");
  const uint32_t n = r.get<uint32_t>("caps.n_target_layers");
  if (n > 4096) throw ProtocolError(fmt::format("caps.n_target_layers is {}, at most 4096", n));
  for (uint32_t i = 0; i < n; ++i) c.target_layers.push_back(r.get<int64_t>("caps.target_layer_ids"));
  return c;
}

void put_stats(Writer& w, const WireStats& s) {
  for (uint64_t v : {s.clients, s.open_sessions, s.forwards, s.steps, s.entries, s.errors, s.max_batch,
                     s.clients_reaped})
    w.put(v);
  w.put(s.uptime_seconds);
}

WireStats get_stats(Reader& r) {
  WireStats s;
  s.clients = r.get<uint64_t>("stats.clients");
  s.open_sessions = r.get<uint64_t>("stats.open_sessions");
  s.forwards = r.get<uint64_t>("stats.forwards");
  s.steps = r.get<uint64_t>("stats.steps");
  s.entries = r.get<uint64_t>("stats.entries");
  s.errors = r.get<uint64_t>("stats.errors");
  s.max_batch = r.get<uint64_t>("stats.max_batch");
  s.clients_reaped = r.get<uint64_t>("stats.clients_reaped");
  s.uptime_seconds = r.get<double>("stats.uptime_seconds");
  return s;
}

}  // namespace tpdraft::serve
