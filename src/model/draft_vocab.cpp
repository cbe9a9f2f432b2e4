// Reading and checking draft vocabularies: token map files (JSON lists, safetensors token_ids),
// the speculators d2t / t2d tensors, and sorted (target id, head row) pairs.
#include "model/draft_vocab.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/files.h"
#include "core/strings.h"
#include "model/selection.h"

namespace tpdraft::model {

namespace {

// The dtypes token ids come in (integer_at reads them).
bool holds_ids(DType t) { return t == DType::I64 || t == DType::I32 || t == DType::I16 || t == DType::U8; }

// The integers of a 1-D integer tensor (I64 or I32).
std::vector<int64_t> integer_tensor(const TensorInfo& t, const char* what) {
  TPDRAFT_CHECK(t.shape.size() == 1, "{}: tensor '{}' has shape {}, expected a 1-D list of {}", t.file, t.name,
                t.shape_str(), what);
  TPDRAFT_CHECK(t.dtype == DType::I64 || t.dtype == DType::I32, "{}: tensor '{}' has dtype {}, expected I64", t.file,
                t.name, dtype_name(t.dtype));
  std::vector<int64_t> out(static_cast<size_t>(t.shape[0]));
  for (size_t i = 0; i < out.size(); ++i) out[i] = integer_at(t, i);
  return out;
}

bool is_pytorch_file(const std::string& path) {
  if (ends_with(path, ".pt") || ends_with(path, ".pth")) return true;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0;  // torch.save writes a zip
}

}  // namespace

DraftVocab make_draft_vocab(const std::vector<int64_t>& target_ids, const std::vector<int64_t>& head_rows,
                            const std::string& source, int64_t vocab) {
  TPDRAFT_CHECK(target_ids.size() == head_rows.size(), "{}: {} target ids for {} head rows", source, target_ids.size(),
                head_rows.size());
  TPDRAFT_CHECK(!target_ids.empty(), "{}: the draft vocabulary is empty", source);
  std::vector<size_t> order(target_ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return target_ids[a] < target_ids[b]; });
  DraftVocab v;
  v.source = source;
  for (size_t i : order) {
    const int64_t id = target_ids[i];
    TPDRAFT_CHECK(id >= 0 && id < vocab, "{}: draft row {} maps to target id {}, outside the vocabulary [0, {})", source,
                  i, id, vocab);
    TPDRAFT_CHECK(v.ids.empty() || v.ids.back() != id, "{}: target id {} is mapped twice", source, id);
    v.ids.push_back(id);
    v.head_rows.push_back(head_rows[i]);
  }
  return v;
}

std::vector<int64_t> read_token_map(const std::string& path, int64_t vocab) {
  close(open_regular_file(path, "token map"));  // a FIFO or a directory is refused, never waited on
  TPDRAFT_CHECK(!is_pytorch_file(path),
                "{}: a PyTorch file (SGLang's token map); convert it to a JSON list first: python3 -c \"import json, "
                "sys, torch; json.dump(torch.load(sys.argv[1]).tolist(), open(sys.argv[1] + '.json', 'w'))\" {}",
                path, path);
  std::vector<int64_t> ids;
  if (ends_with(path, ".safetensors")) {
    const auto store = TensorStore::open(path);
    const TensorInfo* t = store->find("token_ids");
    TPDRAFT_CHECK(t != nullptr, "{}: no tensor 'token_ids' (expected I64 [N], the target ids of the map)", path);
    ids = integer_tensor(*t, "target ids");
  } else {
    const std::string text = read_regular_file(path, "token map");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      TPDRAFT_FAIL("{}: not valid JSON ({}); a token map is a JSON list of target ids or a safetensors file with "
                   "tensor 'token_ids'", path, e.what());
    }
    TPDRAFT_CHECK(j.is_array(), "{}: a token map is a JSON list of target ids, got {}", path, j.type_name());
    ids.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) {
      TPDRAFT_CHECK(j[i].is_number_integer() || j[i].is_number_unsigned(),
                    "{}: entry {} is {}, expected an integer target id", path, i, j[i].dump());
      TPDRAFT_CHECK(!j[i].is_number_unsigned() || j[i].get<uint64_t>() <= static_cast<uint64_t>(vocab),
                    "{}: entry {} is the target id {}, outside the vocabulary [0, {})", path, i, j[i].dump(), vocab);
      ids.push_back(j[i].get<int64_t>());
    }
  }
  TPDRAFT_CHECK(!ids.empty(), "{}: the token map lists no token", path);
  for (size_t i = 0; i < ids.size(); ++i)
    TPDRAFT_CHECK(ids[i] >= 0 && ids[i] < vocab, "{}: entry {} is the target id {}, outside the vocabulary [0, {})",
                  path, i, ids[i], vocab);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void write_token_map(const std::string& path, const std::vector<int64_t>& ids) {
  TPDRAFT_CHECK(write_file_whole(path, nlohmann::json(ids).dump() + "\n"), "{}: cannot write the token map", path);
}

std::vector<int64_t> read_d2t(const TensorStore& store, int64_t draft_vocab, int64_t vocab) {
  const TensorInfo* d2t = store.find("d2t");
  TPDRAFT_CHECK(d2t != nullptr, "{}: tensor 'd2t' is missing: a draft vocabulary of {} < {} tokens needs its map "
                "(I64 [{}], target id = i + d2t[i])", store.source(), draft_vocab, vocab, draft_vocab);
  std::vector<int64_t> ids = integer_tensor(*d2t, "offsets");
  TPDRAFT_CHECK(static_cast<int64_t>(ids.size()) == draft_vocab, "{}: tensor 'd2t' has {} entries, expected "
                "draft_vocab_size = {}", d2t->file, ids.size(), draft_vocab);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = checked_add(static_cast<int64_t>(i), ids[i], "{}: d2t[{}]", d2t->file, i);
    TPDRAFT_CHECK(ids[i] >= 0 && ids[i] < vocab, "{}: tensor 'd2t' maps draft id {} to target id {}, outside [0, {})",
                  d2t->file, i, ids[i], vocab);
  }
  if (const TensorInfo* t2d = store.find("t2d")) {
    TPDRAFT_CHECK(t2d->shape == std::vector<int64_t>{vocab} && (t2d->dtype == DType::BOOL || t2d->dtype == DType::U8),
                  "{}: tensor 't2d' has shape {} and dtype {}, expected BOOL [{}]", t2d->file, t2d->shape_str(),
                  dtype_name(t2d->dtype), vocab);
    std::vector<bool> mapped(static_cast<size_t>(vocab), false);
    for (int64_t id : ids) mapped[static_cast<size_t>(id)] = true;
    for (int64_t t = 0; t < vocab; ++t) {
      const bool marked = t2d->data[t] != std::byte{0};
      TPDRAFT_CHECK(marked == mapped[static_cast<size_t>(t)],
                    "{}: tensors 't2d' and 'd2t' disagree on target id {} (t2d says {}, d2t {})", t2d->file, t,
                    marked ? "drafted" : "not drafted", mapped[static_cast<size_t>(t)] ? "drafted" : "not drafted");
    }
  }
  return ids;
}

namespace {

// Counts the ids of an integer tensor.
uint64_t count_tensor(const TensorInfo& t, std::vector<uint64_t>& counts) {
  const int64_t vocab = static_cast<int64_t>(counts.size());
  const size_t n = static_cast<size_t>(t.numel());
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = integer_at(t, i);
    TPDRAFT_CHECK(id >= 0 && id < vocab, "{}: tensor '{}' holds the token id {} at element {}, outside the vocabulary "
                  "[0, {})", t.file, t.name, id, i, vocab);
    ++counts[static_cast<size_t>(id)];
  }
  return n;
}

}  // namespace

uint64_t count_corpus_tokens(const std::string& path, std::vector<uint64_t>& counts,
                             const std::function<void(uint64_t)>& progress) {
  const int64_t vocab = static_cast<int64_t>(counts.size());
  uint64_t total = 0;
  if (ends_with(path, ".safetensors")) {
    const auto store = TensorStore::open(path);
    bool any = false;
    for (const std::string& name : store->names()) {
      const TensorInfo& t = *store->find(name);
      if (!holds_ids(t.dtype)) continue;
      any = true;
      total += count_tensor(t, counts);
      if (progress) progress(total);
    }
    TPDRAFT_CHECK(any, "{}: no integer tensor (token ids are I64, I32, I16 or U8)", path);
    return total;
  }
  const int fd = open_regular_file(path, "corpus");
  std::ifstream in(path, std::ios::binary);
  close(fd);
  TPDRAFT_CHECK(in.good(), "{}: cannot read the corpus", path);
  std::vector<char> buf(size_t{1} << 20);
  int64_t value = 0, line = 1;
  bool in_number = false, overflow = false;
  auto end_number = [&] {
    if (!in_number) return;
    TPDRAFT_CHECK(!overflow && value < vocab, "{}: line {}: the token id {}{} lies outside the vocabulary [0, {})",
                  path, line, value, overflow ? "..." : "", vocab);
    ++counts[static_cast<size_t>(value)];
    if (++total % (uint64_t{1} << 24) == 0 && progress) progress(total);
    in_number = overflow = false;
    value = 0;
  };
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    for (std::streamsize i = 0; i < got; ++i) {
      const char c = buf[static_cast<size_t>(i)];
      if (c >= '0' && c <= '9') {
        in_number = true;
        overflow = overflow || value > (std::numeric_limits<int64_t>::max() - 9) / 10;
        if (!overflow) value = value * 10 + (c - '0');
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',' || c == '[' || c == ']') {
        end_number();
        if (c == '\n') ++line;
      } else {
        TPDRAFT_FAIL("{}: line {}: '{}' is not a token id; a text corpus holds integer ids separated by whitespace, "
                     "commas or brackets (a safetensors file holds integer tensors)", path, line,
                     std::string(1, c));
      }
    }
  }
  end_number();
  return total;
}

std::vector<int64_t> most_frequent(const std::vector<uint64_t>& counts, int64_t n, const std::vector<int64_t>& keep) {
  const int64_t vocab = static_cast<int64_t>(counts.size());
  std::vector<bool> in_map(counts.size(), false);
  std::vector<int64_t> ids;
  for (int64_t id : keep) {
    TPDRAFT_CHECK(id >= 0 && id < vocab, "--keep {}: outside the vocabulary [0, {})", id, vocab);
    if (!in_map[static_cast<size_t>(id)]) ids.push_back(id);
    in_map[static_cast<size_t>(id)] = true;
  }
  TPDRAFT_CHECK(static_cast<int64_t>(ids.size()) <= n, "--keep lists {} ids, more than the map's size {}", ids.size(), n);
  std::vector<int64_t> seen;
  for (int64_t id = 0; id < vocab; ++id)
    if (counts[static_cast<size_t>(id)] > 0 && !in_map[static_cast<size_t>(id)]) seen.push_back(id);
  const size_t room = std::min(seen.size(), static_cast<size_t>(n) - ids.size());
  std::partial_sort(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(room), seen.end(), [&](int64_t a, int64_t b) {
    return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)] ||
           (counts[static_cast<size_t>(a)] == counts[static_cast<size_t>(b)] && a < b);
  });
  ids.insert(ids.end(), seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(room));
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<int64_t> random_token_ids(int64_t vocab, int64_t n, uint64_t seed) {
  TPDRAFT_CHECK(n >= 1 && n <= vocab, "a random token map of {} ids needs 1 <= n <= vocab = {}", n, vocab);
  // Keyed ranks: the n ids of smallest hash, so the map is the same for a seed on every machine.
  std::vector<std::pair<uint64_t, int64_t>> keyed(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < vocab; ++t) keyed[static_cast<size_t>(t)] = {splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(t)), t};
  std::nth_element(keyed.begin(), keyed.begin() + (n - 1), keyed.end());
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids.push_back(keyed[static_cast<size_t>(i)].second);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace tpdraft::model
