// State_dict files and inference artifacts: the pickle reader (src/interop/pt_reader.cpp), the
// model card reader and the strict load of load_for_inference. A real artifact of a tiny MLP is
// made at start-up; byte 0 of an input picks what the rest replaces: 0 its data.pkl (the pickle,
// with the real tensor records beside it), 1 its card (baton/card.json), else the whole file.
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

#include "baton/inference.hpp"
#include "baton/interop.hpp"
#include "fuzz_common.hpp"

namespace {
/// The records of the real artifact, by name.
const std::map<std::string, std::string>& base_records() {
  static const std::map<std::string, std::string> records = [] {
    auto state = baton::init_state(baton::models::mlp({2, 3, 2}), {.seed = 1, .max_duration = baton::Time::epochs(1)});
    if (!state) baton::fuzz::fail(state.error().to_string());
    const baton::ModelCard card{.model = "mlp", .options = {{"widths", std::vector<double>{2, 3, 2}}}, .input_shape = {2},
                                .classes = {"a", "b"}};
    const auto path = baton::fuzz::scratch_dir() / "base.pt";
    if (auto ok = baton::save_for_inference(*state, card, path); !ok) baton::fuzz::fail(ok.error().to_string());
    caffe2::serialize::PyTorchStreamReader zip(path.string());
    std::map<std::string, std::string> out;
    for (const auto& name : zip.getAllRecords()) {
      auto [data, size] = zip.getRecord(name);
      out[name].assign(static_cast<const char*>(data.get()), size);
    }
    return out;
  }();
  return records;
}

std::string archive(const std::map<std::string, std::string>& records) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, std::size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  for (const auto& [name, bytes] : records)
    if (name != "version") writer.writeRecord(name, bytes.data(), bytes.size());
  writer.writeEndOfFile();
  return out;
}

void check(const baton::Error& e) {
  if (e.message.empty()) baton::fuzz::fail("an error without a message");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  auto records = base_records();
  std::string file;
  switch (data[0]) {
    case 0: records["data.pkl"] = rest; file = archive(records); break;
    case 1: records["baton/card.json"] = rest; file = archive(records); break;
    default: file = rest; break;
  }
  const auto path = baton::fuzz::write_file("in.pt", file);
  if (auto sd = baton::read_state_dict(path); !sd) check(sd.error());
  if (auto card = baton::read_model_card(path); !card) check(card.error());
  // A fixed architecture, so that no fuzzed size is allocated; the file's tensors must fit it.
  auto predictor = baton::load_for_inference(path, baton::models::mlp({2, 3, 2}));
  if (!predictor) {
    check(predictor.error());
    return 0;
  }
  if (auto out = predictor->predict(torch::ones({3, 2})); !out) check(out.error());
  return 0;
}
