// The per-thread message tpdraft_last_error() returns, shared by the in-process calls
// (capi.cpp) and the client's (client.cpp).
#pragma once

#include <string>

namespace tpdraft::capi {
void set_last_error(const std::string& message);
}
