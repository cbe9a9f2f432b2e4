// tpdraft quantize: plan, quantize each selected matrix whole, pack, write.
#include "tools/quantize.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "checkpoint/quant_tensors.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "model/weights.h"

namespace tpdraft::model {

namespace fs = std::filesystem;

QuantizeSummary quantize_checkpoint(const std::string& drafter_dir, const std::string& out_dir,
                                    const QuantRequest& request) {
  const std::string config_path = (fs::path(drafter_dir) / "config.json").string();
  const std::string config_text = read_regular_file(config_path, "drafter config.json");
  const DrafterConfig cfg = DrafterConfig::from_file(config_path);
  TPDRAFT_CHECK(!cfg.quant.any(), "{}: the checkpoint is quantized already (quantization_config); quantize a float "
                "checkpoint", config_path);
  const auto store = TensorStore::open(drafter_dir);
  const QuantConfig plan = plan_quantization(request, expected_drafter_tensors(cfg), QuantConfig::Source::Checkpoint);
  TPDRAFT_CHECK(plan.any(), "quantize: --only {} selects no matrix of {}", request.only, drafter_dir);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TPDRAFT_CHECK(!ec, "{}: cannot create the output directory ({})", out_dir, ec.message());
  TPDRAFT_CHECK(!fs::equivalent(drafter_dir, out_dir, ec), "quantize: --out must differ from --drafter ({})",
                out_dir);
  const std::string out_model = (fs::path(out_dir) / "model.safetensors").string();
  TPDRAFT_CHECK(!fs::exists(out_model, ec), "{}: exists already; quantize into an empty directory", out_model);

  QuantizeSummary sum;
  SafetensorsWriter w;
  for (const std::string& name : store->names()) {
    const TensorInfo& t = *store->find(name);
    sum.bytes_before += t.nbytes;
    ++sum.tensors;
    const QuantScheme s = plan.scheme_for(name);
    if (!s.quantized()) {
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
      sum.bytes_after += t.nbytes;
      continue;
    }
    const QuantShare q = quantize_share(t, s, {0, t.shape[0]}, {0, t.shape[1]});
    const std::vector<int32_t> words = pack_words(q.q.data(), q.rows, q.cols, q.bits);
    const std::vector<int64_t> packed_shape{q.rows, static_cast<int64_t>(words.size()) / q.rows};
    w.add(quant_part(name, "packed"), DType::I32, packed_shape, words.data(), words.size() * 4);
    // Scales in the weights' own dtype: quantize_share rounded them there, so this is exact.
    std::vector<std::byte> scales(q.scales.size() * dtype_size(t.dtype));
    convert_from_f32(t.dtype, q.scales.data(), scales.data(), q.scales.size());
    w.add(quant_part(name, "scale"), t.dtype, {q.rows, q.cols / q.group}, scales.data(), scales.size());
    const int64_t dims[2] = {q.rows, q.cols};
    w.add(quant_part(name, "shape"), DType::I64, {2}, dims, sizeof(dims));
    sum.bytes_after += words.size() * 4 + scales.size() + sizeof(dims);
    ++sum.quantized;
  }
  w.set_metadata("format", "pt");
  w.write(out_model);

  nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_text);
  j["quantization_config"] = nlohmann::ordered_json::parse(plan.to_json().dump());
  const std::string out_config = (fs::path(out_dir) / "config.json").string();
  TPDRAFT_CHECK(write_file_whole(out_config, j.dump(2) + "\n"), "{}: writing failed", out_config);
  return sum;
}

}  // namespace tpdraft::model
