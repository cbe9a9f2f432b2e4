// tpdraft_caps filled from what a drafter reports: the engine's Caps in process, the server's
// WireCaps for a client. Both carry the same fields; `backend` and the strings and arrays stay
// owned by the caller's object, which outlives the caps it hands out. The call `where` fails
// when out->struct_size is too small for the fields.
#pragma once

#include <cstdint>
#include <string>

#include "capi/last_error.h"
#include "tpdraft/tpdraft.h"

namespace tpdraft::capi {

template <typename Caps>
tpdraft_status fill_caps(const char* where, const Caps& c, const std::string& backend, tpdraft_caps* out) {
  if (out->struct_size < sizeof(tpdraft_caps))
    return fail(TPDRAFT_ERROR_ARGUMENT, std::string(where) + ": set out->struct_size to sizeof(tpdraft_caps) first");
  out->architecture = c.architecture.c_str();
  out->backend = backend.c_str();
  out->block_size = static_cast<int32_t>(c.block);
  out->tp = static_cast<int32_t>(c.tp);
  out->taps_width = c.taps_width;
  out->hidden_size = c.hidden;
  out->vocab_size = c.vocab;
  out->mask_token_id = c.mask_token;
  out->n_target_layers = static_cast<int32_t>(c.target_layers.size());
  out->target_layer_ids = c.target_layers.data();
  out->max_sessions = static_cast<int32_t>(c.max_sessions);
  out->max_open_sessions = static_cast<int32_t>(c.max_open_sessions);
  out->max_context = c.max_context;
  out->draft_vocab_size = c.draft_vocab;
  return ok();
}

}  // namespace tpdraft::capi
