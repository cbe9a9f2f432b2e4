// The C ABI (include/tpdraft/tpdraft.h) over a local group of engines (engine/group.h): argument checks, the
// translation of entries, and errors turned into a status and a per-thread message, so that no
// exception crosses into the caller.
#include "tpdraft/tpdraft.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "capi/caps.h"
#include "capi/last_error.h"
#include "core/bounds.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/group.h"
#include "engine/runtime.h"

struct tpdraft_drafter {
  std::mutex mutex;
  std::unique_ptr<tpdraft::engine::Group> group;
  tpdraft::engine::Caps caps;
  std::string backend;
  std::vector<tpdraft::engine::StepEntry> entries;  // reused from step to step
  std::vector<tpdraft::model::DraftResult> results;
  tpdraft_step_times times{};
};

namespace {

using tpdraft::capi::guarded;
using tpdraft::capi::ok;
using tpdraft::capi::refuse;
namespace engine = tpdraft::engine;
namespace model = tpdraft::model;

thread_local std::string t_last_error;

// Refuses an option field outside [least, most] (core/bounds.h: the program's bounds), naming it.
void check_range(const char* field, int64_t value, int64_t least, int64_t most) {
  TPDRAFT_CHECK(value >= least && value <= most, "options.{} is {}, expected {}..{}", field, value, least, most);
}

model::RuntimeOptions runtime_options(const tpdraft_options& o) {
  TPDRAFT_CHECK(o.struct_size >= sizeof(tpdraft_options), "options.struct_size is {}, expected {}: "
                "initialise the options with tpdraft_options_init", o.struct_size, sizeof(tpdraft_options));
  check_range("threads", o.threads, 0, tpdraft::max_threads_per_rank());
  check_range("tp", o.tp, 0, tpdraft::kMaxInProcessRanks);
  check_range("max_sessions", o.max_sessions, 1, tpdraft::kMaxStepEntries);
  check_range("max_context", o.max_context, 1, tpdraft::kMaxContext);
  check_range("max_open_sessions", o.max_open_sessions, 1, tpdraft::kMaxOpenSessions);
  TPDRAFT_CHECK(o.graphs >= -1 && o.graphs <= 1, "options.graphs is {}, expected -1 (auto), 0 or 1", o.graphs);
  const auto& presets = model::quant_presets();
  TPDRAFT_CHECK(o.quant == nullptr || std::find(presets.begin(), presets.end(), o.quant) != presets.end(),
                "options.quant is '{}', expected NULL, {}", o.quant, model::quant_preset_list());
  TPDRAFT_CHECK(o.token_map == nullptr || o.token_ids == nullptr, "options.token_map and options.token_ids are both "
                "set; give the map one way");
  TPDRAFT_CHECK(o.token_ids == nullptr ? o.n_token_ids == 0
                                       : o.n_token_ids >= 1 && o.n_token_ids <= model::size_limit("vocab_size"),
                "options.n_token_ids is {}, expected 1..{} with token_ids (0 without)", o.n_token_ids,
                model::size_limit("vocab_size"));
  const std::string kv_dtype = o.kv_dtype != nullptr ? o.kv_dtype : "f32";
  TPDRAFT_CHECK(kv_dtype == "f32" || kv_dtype == "bf16", "options.kv_dtype is '{}', expected NULL, 'f32' or 'bf16'",
                kv_dtype);
  model::RuntimeOptions r;
  r.backend = o.backend != nullptr ? o.backend : "auto";
  // threads 0: the machine's cores shared among the ranks of this process, as the header says.
  r.threads = engine::threads_per_rank(o.threads, o.tp);
  r.limits.max_sessions = o.max_sessions;
  r.limits.max_context = o.max_context;
  r.limits.kv_dtype = kv_dtype == "bf16" ? tpdraft::DType::BF16 : tpdraft::DType::F32;
  r.graphs = o.graphs < 0 ? model::GraphMode::Auto : o.graphs ? model::GraphMode::On : model::GraphMode::Off;
  return r;
}

tpdraft::DType dtype_of(int32_t d, size_t i) {
  switch (d) {
    case TPDRAFT_F32: return tpdraft::DType::F32;
    case TPDRAFT_BF16: return tpdraft::DType::BF16;
    case TPDRAFT_F16: return tpdraft::DType::F16;
  }
  TPDRAFT_FAIL("entry {}: taps_dtype {} is not TPDRAFT_F32, TPDRAFT_BF16 or TPDRAFT_F16", i, d);
}

// The engine's entry, and the output buffers an entry must bring.
engine::StepEntry translate(const tpdraft_step_entry& e, size_t i) {
  const std::string missing = tpdraft::capi::missing_buffer(e, i);
  TPDRAFT_CHECK(missing.empty(), "{}", missing);
  return {e.session, e.keep, e.p0, e.n_new, {e.taps, dtype_of(e.taps_dtype, i), e.taps_on_device != 0, e.taps_stream},
          e.anchor, {e.sampling.temperature, e.sampling.top_k, e.sampling.top_p, e.sampling.seed}, e.dist_width};
}

void copy_out(const model::DraftResult& r, tpdraft_step_entry& e, int64_t vocab) {
  const size_t rows = r.tokens.size();
  std::memcpy(e.tokens, r.tokens.data(), rows * sizeof(int64_t));
  if (e.q != nullptr) std::memcpy(e.q, r.probs.data(), rows * sizeof(float));
  if (e.dist_width == 0) return;
  const size_t width = e.dist_width == TPDRAFT_DIST_FULL ? static_cast<size_t>(vocab) : static_cast<size_t>(e.dist_width);
  for (size_t row = 0; row < rows; ++row) {
    const model::RowDistribution& d = r.dists[row];
    std::memcpy(e.dist_probs + row * width, d.probs.data(), width * sizeof(float));
    if (e.dist_width > 0) std::memcpy(e.dist_ids + row * width, d.ids.data(), width * sizeof(int64_t));
    if (e.dist_rest != nullptr) e.dist_rest[row] = d.rest;
  }
}

}  // namespace

void tpdraft::capi::set_last_error(const std::string& message) { t_last_error = message; }

std::string tpdraft::capi::missing_buffer(const tpdraft_step_entry& e, size_t i) {
  if (e.tokens == nullptr) return fmt::format("entry {}: no tokens buffer", i);
  if (e.dist_width != 0 && e.dist_probs == nullptr)
    return fmt::format("entry {}: dist_width {} but no dist_probs buffer", i, e.dist_width);
  if (e.dist_width > 0 && e.dist_ids == nullptr)
    return fmt::format("entry {}: dist_width {} but no dist_ids buffer", i, e.dist_width);
  return "";
}

extern "C" {

const char* tpdraft_version(void) { return TPDRAFT_VERSION_STRING; }

const char* tpdraft_last_error(void) { return t_last_error.c_str(); }

static_assert(TPDRAFT_LOG_TRACE == static_cast<int>(spdlog::level::trace) &&
              TPDRAFT_LOG_WARN == static_cast<int>(spdlog::level::warn) &&
              TPDRAFT_LOG_OFF == static_cast<int>(spdlog::level::off), "the header's log levels are spdlog's");

tpdraft_status tpdraft_set_log_level(const char* level) {
  const auto parsed = level != nullptr ? tpdraft::log::parse_level(level) : std::nullopt;
  if (!parsed)
    return refuse(fmt::format("tpdraft_set_log_level: '{}' names no log level; expected one of trace, debug, info, "
                              "warn, error, critical, off (any case)", level != nullptr ? level : "(null)"));
  tpdraft::log::set_level(*parsed);
  return ok();
}

tpdraft_status tpdraft_set_log_callback(tpdraft_log_callback callback, void* user) {
  if (!tpdraft::log::set_callback(callback, user))
    return refuse("tpdraft_set_log_callback: called from inside the log callback");
  return ok();
}

const char* tpdraft_status_name(int status) {
  // By the statuses' values, TPDRAFT_OK = 0 to TPDRAFT_ERROR_BUSY = 5.
  static const char* const names[] = {"ok", "argument", "input", "runtime", "unavailable", "busy"};
  return status >= 0 && status < static_cast<int>(std::size(names)) ? names[status] : "unknown";
}

void tpdraft_options_init(tpdraft_options* o) {
  if (o == nullptr) return;
  *o = tpdraft_options{};
  o->struct_size = sizeof(tpdraft_options);
  o->backend = "auto";
  o->threads = 0;
  o->tp = 1;
  o->max_sessions = 8;
  o->max_context = 4096;
  o->max_open_sessions = 64;
  o->graphs = -1;
}

void tpdraft_step_entry_init(tpdraft_step_entry* e) {
  if (e == nullptr) return;
  *e = tpdraft_step_entry{};
  e->keep = -1;
  e->p0 = -1;
  e->taps_dtype = TPDRAFT_F32;
  e->sampling.top_p = 1.0;
}

tpdraft_status tpdraft_open(const char* drafter_dir, const char* target_dir, const tpdraft_options* options,
                            tpdraft_drafter** out) {
  if (out == nullptr) return refuse("tpdraft_open: out is NULL");
  *out = nullptr;
  if (drafter_dir == nullptr || target_dir == nullptr) return refuse("tpdraft_open: a checkpoint directory is NULL");
  tpdraft_options defaults;
  tpdraft_options_init(&defaults);
  const tpdraft_options& o = options != nullptr ? *options : defaults;
  return guarded("tpdraft_open", TPDRAFT_ERROR_INPUT, [&] {
    const model::RuntimeOptions ro = runtime_options(o);
    auto d = std::make_unique<tpdraft_drafter>();
    model::ModelSource source = model::ModelSource::open(drafter_dir, target_dir);
    if (o.token_map != nullptr) model::apply_token_map(source, o.token_map);
    if (o.token_ids != nullptr)
      model::apply_token_map(source, std::vector<int64_t>(o.token_ids, o.token_ids + o.n_token_ids),
                             "options.token_ids");
    if (o.quant != nullptr) model::quantize_on_load(source, o.quant);
    d->group = std::make_unique<engine::LocalGroup>(std::move(source), ro, std::max(1, o.tp), o.max_open_sessions);
    d->caps = d->group->caps();
    d->backend = d->group->leader().runtime().ops().name();
    *out = d.release();
  });
}

void tpdraft_close(tpdraft_drafter* drafter) {
  if (drafter == nullptr) return;
  // A call in flight on another thread holds the mutex: it finishes before anything is freed.
  { std::lock_guard<std::mutex> wait_for_calls(drafter->mutex); }
  // Destructors do not throw; whatever a device reports on the way out is not the caller's to act on.
  delete drafter;
}

tpdraft_status tpdraft_caps_get(const tpdraft_drafter* d, tpdraft_caps* out) {
  if (d == nullptr || out == nullptr) return refuse("tpdraft_caps_get: drafter or out is NULL");
  return tpdraft::capi::fill_caps("tpdraft_caps_get", d->caps, d->backend, out);
}

tpdraft_status tpdraft_session_open(tpdraft_drafter* d, tpdraft_session* out) {
  if (d == nullptr || out == nullptr) return refuse("tpdraft_session_open: drafter or out is NULL");
  std::lock_guard<std::mutex> lock(d->mutex);
  // The limit is checked once, on the leader, before any rank opens: the ranks stay alike.
  const int64_t open = d->group->leader().open_sessions();
  if (open >= d->caps.max_open_sessions)
    return refuse("tpdraft_session_open: all " + std::to_string(open) + " sessions allowed (max_open_sessions) are open");
  return guarded("tpdraft_session_open", TPDRAFT_ERROR_RUNTIME, [&] { *out = d->group->open_session(); });
}

tpdraft_status tpdraft_session_close(tpdraft_drafter* d, tpdraft_session session) {
  if (d == nullptr) return refuse("tpdraft_session_close: drafter is NULL");
  std::lock_guard<std::mutex> lock(d->mutex);
  const tpdraft_status st =
      guarded("tpdraft_session_close", TPDRAFT_ERROR_ARGUMENT, [&] { d->group->leader().check_open(session); });
  if (st != TPDRAFT_OK) return st;
  return guarded("tpdraft_session_close", TPDRAFT_ERROR_RUNTIME, [&] { d->group->close_session(session); });
}

tpdraft_status tpdraft_session_length(tpdraft_drafter* d, tpdraft_session session, int64_t* out) {
  if (d == nullptr || out == nullptr) return refuse("tpdraft_session_length: drafter or out is NULL");
  std::lock_guard<std::mutex> lock(d->mutex);
  return guarded("tpdraft_session_length", TPDRAFT_ERROR_ARGUMENT,
                 [&] { *out = d->group->leader().session_length(session); });
}

tpdraft_status tpdraft_last_step_times(tpdraft_drafter* d, tpdraft_step_times* out) {
  if (d == nullptr || out == nullptr) return refuse("tpdraft_last_step_times: drafter or out is NULL");
  std::lock_guard<std::mutex> lock(d->mutex);
  *out = d->times;
  return ok();
}

tpdraft_status tpdraft_step(tpdraft_drafter* d, tpdraft_step_entry* entries, size_t count) {
  const auto started = std::chrono::steady_clock::now();
  if (d == nullptr) return refuse("tpdraft_step: drafter is NULL");
  if (entries == nullptr && count > 0) return refuse("tpdraft_step: entries is NULL");
  // The count first: no entry past what the caller may hold is read.
  if (count == 0 || count > static_cast<size_t>(d->caps.max_sessions))
    return refuse(fmt::format("tpdraft_step: a step takes 1 to {} entries (max sessions), got {}", d->caps.max_sessions,
                              count));
  std::lock_guard<std::mutex> lock(d->mutex);
  tpdraft_status st = guarded("tpdraft_step", TPDRAFT_ERROR_ARGUMENT, [&] {
    d->entries.clear();
    for (size_t i = 0; i < count; ++i) d->entries.push_back(translate(entries[i], i));
    d->group->leader().check(d->entries);
  });
  if (st != TPDRAFT_OK) return st;
  st = guarded("tpdraft_step", TPDRAFT_ERROR_RUNTIME, [&] { d->results = d->group->apply(d->entries); });
  if (st != TPDRAFT_OK) return st;
  for (size_t i = 0; i < count; ++i) copy_out(d->results[i], entries[i], d->caps.vocab);
  const engine::StepTimes& t = d->group->leader().last_times();
  d->times = {t.settle, t.draft, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()};
  return TPDRAFT_OK;
}

}  // extern "C"
