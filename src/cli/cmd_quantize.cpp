// `tpdraft quantize`: a float drafter checkpoint rewritten with int4 / int8 matrices in the
// compressed-tensors pack-quantized layout (docs/quantization.md).
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "tools/quantize.h"

namespace tpdraft::cli {

void add_quantize(CLI::App& app) {
  struct Opts {
    std::string drafter, out;
    model::QuantRequest request;  // its defaults are the options' defaults
  };
  auto opts = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a quantized copy of a float drafter checkpoint: round to nearest, symmetric, in the "
                  "compressed-tensors pack-quantized layout (OUT/config.json + OUT/model.safetensors)");
  cmd->add_option("--drafter", opts->drafter, "Float drafter directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", opts->out, "Output directory (created; must not hold a model.safetensors)")->required();
  cmd->add_option("--bits", opts->request.bits, "Bits per weight")->check(CLI::IsMember({4, 8}))->capture_default_str();
  cmd->add_option("--group", opts->request.group,
                  "Columns per scale (0: one scale per row); a matrix whose columns it does not divide gets one "
                  "scale per row")
      ->check(whole_number(0))
      ->capture_default_str();
  cmd->add_option("--only", opts->request.only, "Which layer matrices: all, mlp (gate, up, down) or attn (q, k, v, o)")
      ->check(CLI::IsMember({"all", "mlp", "attn"}))
      ->capture_default_str();
  cmd->add_flag("--include-fc", opts->request.include_fc, "Quantize fc too");
  cmd->callback([opts] {
    run_alone([&] {
      const model::QuantizeSummary s = model::quantize_checkpoint(opts->drafter, opts->out, opts->request);
      std::printf("%s: %zu of %zu tensors quantized, %.2f MiB -> %.2f MiB\n", opts->out.c_str(), s.quantized,
                  s.tensors, static_cast<double>(s.bytes_before) / (1 << 20),
                  static_cast<double>(s.bytes_after) / (1 << 20));
    });
  });
}

}  // namespace tpdraft::cli
