// The checkpoint header: encoding and decoding (checkpoint_header.hpp).
#include "checkpoint_header.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail.hpp"

namespace baton::detail::ckpt {
namespace fs = std::filesystem;
namespace {
constexpr std::pair<at::ScalarType, std::string_view> kDtypes[] = {
    {at::ScalarType::Float, "float32"},   {at::ScalarType::Double, "float64"},
    {at::ScalarType::Half, "float16"},    {at::ScalarType::BFloat16, "bfloat16"},
    {at::ScalarType::Long, "int64"},      {at::ScalarType::Int, "int32"},
    {at::ScalarType::Short, "int16"},     {at::ScalarType::Char, "int8"},
    {at::ScalarType::Byte, "uint8"},      {at::ScalarType::Bool, "bool"},
    {at::ScalarType::ComplexFloat, "complex64"}, {at::ScalarType::ComplexDouble, "complex128"},
};

// ------------------------------------------------------------------ header (JSON)
json to_json(const Timestamp& t) {
  return {{"epoch", t.epoch}, {"batch", t.batch}, {"sample", t.sample},
          {"batch_in_epoch", t.batch_in_epoch}, {"sample_in_epoch", t.sample_in_epoch}};
}

Timestamp timestamp_of(const json& j) {
  return {j.at("epoch").get<std::int64_t>(), j.at("batch").get<std::int64_t>(), j.at("sample").get<std::int64_t>(),
          j.at("batch_in_epoch").get<std::int64_t>(), j.at("sample_in_epoch").get<std::int64_t>()};
}

// JSON has no NaN or infinity; a stage that took no step records a NaN loss.
json to_json(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

double real_of(const json& j) {
  if (j.is_number()) return j.get<double>();
  const auto s = j.get<std::string>();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf" || s == "-inf") return (s[0] == '-' ? -1 : 1) * std::numeric_limits<double>::infinity();
  throw std::invalid_argument(fmt::format("\"{}\" is not a number", s));
}

json to_json(const StageRecord& r) {
  json j = {{"name", r.name}, {"start", to_json(r.start)}, {"end", to_json(r.end)},
            {"last_loss", to_json(r.last_loss)}, {"last_lr", to_json(r.last_lr)},
            {"last_grad_norm", to_json(r.last_grad_norm)}, {"transfer", nullptr}, {"interrupted", r.interrupted}};
  if (!r.stop_reason.empty()) j["stop_reason"] = r.stop_reason;
  if (r.skipped_batches != 0) j["skipped_batches"] = r.skipped_batches;
  if (!r.restored_best.empty()) j["restored_best"] = r.restored_best;
  if (r.transfer)
    j["transfer"] = {{"copied", r.transfer->copied}, {"skipped", r.transfer->skipped},
                     {"initialized", r.transfer->initialized}};
  return j;
}

StageRecord record_of(const json& j) {
  StageRecord r{j.at("name").get<std::string>(), timestamp_of(j.at("start")), timestamp_of(j.at("end")),
                real_of(j.at("last_loss")), real_of(j.at("last_lr")), real_of(j.at("last_grad_norm")), std::nullopt,
                j.value("interrupted", false), j.value("stop_reason", std::string()),
                j.value("skipped_batches", std::int64_t{0}), j.value("restored_best", std::string())};
  if (const auto& t = j.at("transfer"); !t.is_null())
    r.transfer = TransferReport{t.at("copied").get<std::vector<std::string>>(),
                                t.at("skipped").get<std::vector<std::string>>(),
                                t.at("initialized").get<std::vector<std::string>>()};
  return r;
}

json callback_json(const std::map<std::string, std::map<std::string, double>>& state) {
  json j = json::object();
  for (const auto& [cb, values] : state) {
    json v = json::object();
    for (const auto& [key, value] : values) v[key] = to_json(value);
    j[cb] = std::move(v);
  }
  return j;
}

void check_time(const Timestamp& t, const char* field) {
  if (t.epoch < 0 || t.batch < 0 || t.sample < 0 || t.batch_in_epoch < 0 || t.sample_in_epoch < 0)
    throw std::invalid_argument(fmt::format("{} has a negative counter ({})", field, t.to_string()));
  // Every epoch boundary follows at least one batch; the in-epoch counters are parts of the totals.
  if (t.epoch > t.batch + 1 || t.batch_in_epoch > t.batch || t.sample_in_epoch > t.sample || t.batch > t.sample)
    throw std::invalid_argument(fmt::format("{} is not a position a run can reach (epoch {}, batch {}, sample {}, "
                                            "{} batches and {} samples into the epoch)",
                                            field, t.epoch, t.batch, t.sample, t.batch_in_epoch, t.sample_in_epoch));
}

/// Fields that parse but make no sense: the file was written by something else than baton, or
/// edited, with a valid checksum. Refused like a corrupt file (a resume skips it).
void check_sense(const Header& h, const json& raw) {
  const CheckpointInfo& info = h.info;
  check_time(info.time, "time");
  check_time(h.stage_start, "stage_start");
  if (h.stage_start.batch > info.time.batch || h.stage_start.sample > info.time.sample)
    throw std::invalid_argument(fmt::format("the stage starts ({}) after the state's time ({})",
                                            h.stage_start.to_string(), info.time.to_string()));
  const Time& max = info.max_duration;
  if (max.unit == TimeUnit::duration || !std::isfinite(max.value) || max.value <= 0)
    throw std::invalid_argument(fmt::format("max_duration \"{}\" is not a positive count of ep, ba or sp",
                                            raw.at("max_duration").get<std::string>()));
  if (info.meta.stage_index < -1)  // -1: written outside a curriculum
    throw std::invalid_argument(fmt::format("meta.stage_index {} is below -1", info.meta.stage_index));
  for (const auto& r : h.history) {
    check_time(r.start, "a history record's start");
    check_time(r.end, "a history record's end");
    if (r.end.batch < r.start.batch)
      throw std::invalid_argument(fmt::format("the history record of stage \"{}\" ends before it starts", r.name));
  }
  for (const auto& [name, ps] : h.optimizer.params)
    if (ps.step < 0) throw std::invalid_argument(fmt::format("the optimizer step of \"{}\" is negative", name));
}
}  // namespace

std::optional<std::string_view> dtype_name(at::ScalarType t) {
  for (const auto& [type, name] : kDtypes)
    if (type == t) return name;
  return std::nullopt;
}

std::optional<at::ScalarType> dtype_of(std::string_view name) {
  for (const auto& [type, n] : kDtypes)
    if (n == name) return type;
  return std::nullopt;
}

torch::Tensor host(const torch::Tensor& t) { return t.defined() ? t.detach().to(torch::kCPU).contiguous() : t; }

std::uint64_t byte_size(const torch::Tensor& t) {
  return t.defined() ? static_cast<std::uint64_t>(t.numel()) * t.element_size() : 0;
}

std::vector<Entry> entries_of(const TrainState& s) {
  std::vector<Entry> out;
  for (auto& [name, t] : s.named_parameters()) out.push_back({"parameter", name, 0, host(t)});
  for (auto& [name, t] : s.named_buffers()) out.push_back({"buffer", name, 0, host(t)});
  for (const auto& [name, ps] : s.optimizer.params)
    for (std::size_t i = 0; i < ps.slots.size(); ++i)
      out.push_back({"optimizer_slot", name, static_cast<std::int64_t>(i), host(ps.slots[i])});
  out.push_back({"rng", "rng", 0, host(s.rng)});
  for (const auto& [algorithm, tensors] : s.algorithm_state)
    for (const auto& [name, t] : tensors) out.push_back({"algorithm", name, 0, host(t), algorithm});
  return out;
}

std::string encode_header(const TrainState& s, const CheckpointMeta& meta, const std::vector<Entry>& entries) {
  json history = json::array(), opt_params = json::array(), tensors = json::array();
  for (const auto& r : s.history) history.push_back(to_json(r));
  for (const auto& [name, ps] : s.optimizer.params)
    opt_params.push_back({{"name", name}, {"step", ps.step}, {"slots", ps.slots.size()}});
  std::uint64_t offset = 0;
  for (const auto& e : entries) {
    json d = {{"group", e.group}, {"name", e.name}, {"slot", e.slot}, {"defined", e.tensor.defined()}};
    if (e.group == "algorithm") d["owner"] = e.owner;
    if (e.tensor.defined()) {
      const auto dtype = dtype_name(e.tensor.scalar_type());
      if (!dtype || e.tensor.layout() != torch::kStrided || e.tensor.is_quantized())
        detail::raise(ErrorCode::invalid_argument,
                      fmt::format("{} \"{}\" has dtype {} and layout {}, which checkpoints do not store (dense "
                                  "float, integer, bool and complex tensors only)",
                                  e.group, e.name, c10::toString(e.tensor.scalar_type()), c10::str(e.tensor.layout())));
      d["dtype"] = *dtype;
      d["shape"] = e.tensor.sizes().vec();
      d["offset"] = offset;
      d["nbytes"] = byte_size(e.tensor);
      offset += byte_size(e.tensor);
    }
    tensors.push_back(std::move(d));
  }
  json header = {
      {"meta", {{"run_name", meta.run_name}, {"config_fingerprint", meta.config_fingerprint},
                {"stage_index", meta.stage_index}, {"extra", meta.extra}}},
      {"time", to_json(s.time)},
      {"stage", s.stage},
      {"stage_start", to_json(s.stage_start)},
      {"seed", s.seed},
      {"max_duration", s.max_duration.to_string()},
      {"history", std::move(history)},
      {"optimizer", {{"kind", s.optimizer.kind}, {"params", std::move(opt_params)}}},
      {"params_sha256", params_sha256(s)},
      {"tensors", std::move(tensors)},
      {"callback_state", callback_json(s.callback_state)},
  };
  if (s.loss_scale)
    header["loss_scale"] = {{"scale", s.loss_scale->scale}, {"growth_tracker", s.loss_scale->growth_tracker},
                            {"skipped", s.loss_scale->skipped}};
  try {
    return header.dump(1);
  } catch (const json::exception& e) {  // e.g. a stage name that is not UTF-8
    detail::raise(ErrorCode::invalid_argument, fmt::format("cannot encode the checkpoint header: {}", e.what()));
  }
}


[[noreturn]] void raise_data(const fs::path& path, const std::string& what) {
  detail::raise(ErrorCode::data, fmt::format("checkpoint \"{}\": {}", path.string(), what));
}

Header decode_header(const json& h, std::uint32_t version, const fs::path& path) {
  return decode(path, [&] {
    const json& m = h.at("meta");
    Header out;
    CheckpointInfo& info = out.info;
    info.format_version = version;
    info.meta = {m.at("run_name").get<std::string>(), m.at("config_fingerprint").get<std::string>(),
                 m.at("stage_index").get<std::int64_t>(), m.at("extra").get<std::map<std::string, std::string>>()};
    info.time = timestamp_of(h.at("time"));
    info.stage = h.at("stage").get<std::string>();
    info.seed = h.at("seed").get<std::uint64_t>();
    const auto max = Time::parse(h.at("max_duration").get<std::string>());
    if (!max) throw std::invalid_argument(max.error().message);
    info.max_duration = *max;
    info.params_sha256 = h.at("params_sha256").get<std::string>();
    out.stage_start = timestamp_of(h.at("stage_start"));
    for (const json& r : h.at("history")) out.history.push_back(record_of(r));
    out.optimizer.kind = h.at("optimizer").at("kind").get<std::string>();
    for (const json& p : h.at("optimizer").at("params")) {
      ParamState& ps = out.optimizer.params[p.at("name").get<std::string>()];
      ps.step = p.at("step").get<std::int64_t>();
      const auto slots = p.at("slots").get<std::uint64_t>();
      if (slots > 16) throw std::invalid_argument(fmt::format("{} optimizer slots for one parameter", slots));
      ps.slots.resize(slots);
    }
    if (version >= 2)
      for (const auto& [cb, values] : h.at("callback_state").items()) {
        // A callback that kept nothing has no entry (older checkpoints hold an empty one: dropped).
        for (const auto& [key, value] : values.items()) out.callback_state[cb][key] = real_of(value);
      }
    if (version >= 3 && h.contains("loss_scale")) {
      const json& l = h.at("loss_scale");
      out.loss_scale = LossScaleState{l.at("scale").get<double>(), l.at("growth_tracker").get<std::int64_t>(),
                                      l.at("skipped").get<std::int64_t>()};
      if (!(out.loss_scale->scale > 0) || !std::isfinite(out.loss_scale->scale) || out.loss_scale->growth_tracker < 0 ||
          out.loss_scale->skipped < 0)
        throw std::invalid_argument("loss_scale: the scale must be finite and > 0, the counters >= 0");
    }
    check_sense(out, h);
    return out;
  });
}

}  // namespace baton::detail::ckpt
