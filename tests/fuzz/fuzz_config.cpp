// libFuzzer harness for the drafter config parser (DrafterConfig::from_json): each input is a
// config.json. Inputs that are not JSON are dropped; every JSON value must either be refused
// with a tpdraft::Error or give a config that to_json() writes and from_json() reads back to the
// same JSON. Anything else (another exception, a crash, a sanitizer report, a hang or a huge
// allocation) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpdraft;
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const model::DrafterConfig c = model::DrafterConfig::from_json(j, "fuzz/config.json");
    const nlohmann::json written = c.to_json();
    if (model::DrafterConfig::from_json(written, "fuzz/written.json").to_json() != written) std::abort();
  } catch (const Error&) {
    // a rejection with a message: what a bad config should get
  }
  return 0;
}
