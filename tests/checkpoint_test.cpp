// Checkpoints: a saved and loaded state is the same value, a resumed run equals the uninterrupted
// one bit for bit, and every kind of bad file or failed write is an error, never a crash.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <baton/checkpoint.hpp>

#include <baton/testing_catch.hpp>

#include "helpers.hpp"

namespace fs = std::filesystem;
using baton::ErrorCode;
using baton::Time;
using Catch::Contains;
using test::ok;

namespace {
const baton::Dataset& data() {
  static const auto d = test::blobs(1000);
  return d;
}

using test::TempDir;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out);
}

bool same_double(double x, double y) {
  return std::isnan(x) ? std::isnan(y) : std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
}

/// Everything a state is, compared bit for bit (bitwise_equal covers tensors, time and stage).
void require_same_run(const baton::TrainState& a, const baton::TrainState& b) {
  REQUIRE(baton::bitwise_equal(a, b));
  REQUIRE(a.rng.equal(b.rng));
  REQUIRE(a.seed == b.seed);
  REQUIRE(a.max_duration == b.max_duration);
  REQUIRE(a.history.size() == b.history.size());
  for (std::size_t i = 0; i < a.history.size(); ++i) {
    const auto &x = a.history[i], &y = b.history[i];
    INFO("history[" << i << "] " << x.name);
    CHECK(x.name == y.name);
    CHECK(x.start == y.start);
    CHECK(x.end == y.end);
    CHECK(same_double(x.last_loss, y.last_loss));
    CHECK(same_double(x.last_lr, y.last_lr));
    CHECK(same_double(x.last_grad_norm, y.last_grad_norm));
    REQUIRE(x.transfer.has_value() == y.transfer.has_value());
    if (x.transfer) {
      CHECK(x.transfer->copied == y.transfer->copied);
      CHECK(x.transfer->skipped == y.transfer->skipped);
      CHECK(x.transfer->initialized == y.transfer->initialized);
    }
  }
}

baton::Expected<baton::TrainState> load(const fs::path& p) { return baton::load_checkpoint(p, test::bn_dropout_mlp()); }

/// Saves and loads `s`, checking the loaded state is the same value.
baton::TrainState reload(const baton::TrainState& s, const fs::path& p) {
  const auto saved = baton::save_checkpoint(s, p);
  if (!saved) FAIL(saved.error().to_string());
  auto loaded = ok(load(p));
  require_same_run(loaded, s);
  CHECK(loaded.model.module->is_training());
  return loaded;
}

// The file format of docs/checkpoint.md, written independently of src/checkpoint.cpp.
struct Parts {
  std::uint32_t version = 0;
  std::string header, data;
};

template <class T>
T read_le(const std::string& b, std::size_t at) {
  T v{};
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

Parts split(const std::string& b) {
  REQUIRE(b.substr(0, 8) == "BATONCKP");
  Parts p;
  p.version = read_le<std::uint32_t>(b, 8);
  const auto h = read_le<std::uint64_t>(b, 12);
  p.header = b.substr(20, h);
  const auto d = read_le<std::uint64_t>(b, 20 + h);
  p.data = b.substr(28 + h, d);
  REQUIRE(b.size() == 28 + h + d + 32);
  return p;
}

std::string sha256(const std::string& bytes) {
  std::string out(32, '\0');
  unsigned int n = 0;
  REQUIRE(EVP_Digest(bytes.data(), bytes.size(), reinterpret_cast<unsigned char*>(out.data()), &n, EVP_sha256(), nullptr) == 1);
  return out;
}

std::string hex(const std::string& digest) {
  std::string s;
  for (unsigned char c : digest) s += fmt::format("{:02x}", c);
  return s;
}

template <class T>
void append_le(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string frame(const Parts& p) {
  std::string b = "BATONCKP";
  append_le(b, p.version);
  append_le(b, static_cast<std::uint64_t>(p.header.size()));
  b += p.header;
  append_le(b, static_cast<std::uint64_t>(p.data.size()));
  b += p.data;
  return b + sha256(b);
}

void require_error(const baton::Expected<baton::TrainState>& r, ErrorCode code, const std::string& text) {
  REQUIRE_FALSE(r);
  INFO(r.error().to_string());
  CHECK(r.error().code == code);
  CHECK_THAT(r.error().message, Contains(text));
}
}  // namespace

TEST_CASE("a loaded checkpoint is the saved state -- loading leaves the caller's RNG alone", "[checkpoint]") {
  TempDir dir;
  const auto s = ok(baton::fit(test::spec(data(), Time::batches(45)), test::new_state()));
  REQUIRE(s.time.batch_in_epoch == 13);
  REQUIRE(baton::save_checkpoint(s, dir.path / "c.baton"));
  torch::manual_seed(123);
  const auto before = torch::rand({4});
  torch::manual_seed(123);
  auto loaded = ok(load(dir.path / "c.baton"));
  CHECK(torch::rand({4}).equal(before));
  require_same_run(loaded, s);
  CHECK(loaded.model.module->is_training());
  const auto copy = loaded;  // the factory given to load_checkpoint makes copies
  require_same_run(copy, s);
  CHECK(dir.names() == std::vector<std::string>{"c.baton"});  // no temporary file left behind

  // A path without a directory part is relative to the working directory.
  const auto cwd = fs::current_path();
  fs::current_path(dir.path);
  const auto rel = baton::save_checkpoint(s, "rel.baton");
  fs::current_path(cwd);
  REQUIRE(rel);
  require_same_run(ok(load(dir.path / "rel.baton")), s);

  // Non-finite history values (a stage that took no step records a NaN loss) survive too.
  auto odd = s;
  odd.history.push_back({"odd", s.time, s.time, std::nan(""), std::numeric_limits<double>::infinity(), -0.0,
                         baton::TransferReport{{"a"}, {"b (why)"}, {}}});
  require_same_run(reload(odd, dir.path / "odd.baton"), odd);
}

TEST_CASE("resuming from a checkpoint equals the uninterrupted run wherever it was saved", "[checkpoint]") {
  TempDir dir;
  const auto a = test::spec(data(), Time::epochs(2)).with_name("a");  // 64 batches
  const auto b = test::spec(data(), Time::epochs(1))
                     .with_name("b")
                     .with_lr(0.02)
                     .with_model(baton::ModelCarry::transfer(test::bn_dropout_mlp()).reinitializing({"4.*"}));
  const auto whole = ok(baton::fit(b, ok(baton::fit(a, test::new_state()))));
  REQUIRE(whole.history.size() == 2);
  REQUIRE(whole.history[1].transfer);
  REQUIRE(whole.finished());

  // Saved after k batches of stage a: 32 an epoch boundary, 45 mid-epoch, 63 before its last
  // batch, 64 after it (the next fit begins stage b).
  for (std::int64_t k : {32, 45, 63, 64}) {
    INFO("saved after batch " << k << " of stage a");
    auto s = reload(ok(baton::fit(a, test::new_state(), Time::batches(k))), dir.path / "a.baton");
    if (k < 64) s = ok(baton::fit(a, std::move(s), Time::batches(64 - k)));
    require_same_run(ok(baton::fit(b, std::move(s))), whole);
  }
  {
    INFO("saved after the first batch of stage b");
    auto s = ok(baton::fit(b, ok(baton::fit(a, test::new_state())), Time::batches(1)));
    REQUIRE(s.stage == "b");
    REQUIRE(s.history.back().transfer);
    s = reload(s, dir.path / "b.baton");
    require_same_run(ok(baton::fit(b, std::move(s), Time::batches(31))), whole);
  }
}

TEST_CASE("three save/load/resume cycles with Adam and gradient accumulation equal no resume", "[checkpoint]") {
  TempDir dir;
  const auto c = test::spec(data(), Time::epochs(2))
                     .with_name("adam")
                     .with_optimizer(baton::optim::adam({.lr = 1e-2}), baton::Carry::fresh)
                     .with_grad_accum(4);
  const auto whole = ok(baton::fit(c, test::new_state()));
  auto s = test::new_state();
  for (std::int64_t k : {5, 27, 18}) {  // the same file is replaced each time
    s = reload(ok(baton::fit(c, std::move(s), Time::batches(k))), dir.path / "c.baton");
    REQUIRE(s.optimizer.kind == "adam");
  }
  s = ok(baton::fit(c, std::move(s), Time::batches(64 - 50)));
  require_same_run(s, whole);
  // Adam keeps amsgrad's slot undefined: an undefined slot survives the round trip as such.
  const auto& slots = s.optimizer.params.at("0.weight").slots;
  REQUIRE(slots.size() == 3);
  CHECK(slots[0].defined());
  CHECK_FALSE(slots[2].defined());
  CHECK(s.optimizer.params.at("0.weight").step == 64);
  // The same property through baton::testing, mid-epoch and at an epoch boundary.
  CHECK(baton::testing::resume_invariant(c, test::new_state(), Time::batches(45)));
  CHECK(baton::testing::resume_invariant(c, test::new_state(), Time::epochs(1)));
}

TEST_CASE("the header is readable without the model and holds the caller's metadata", "[checkpoint]") {
  TempDir dir;
  const auto s = ok(baton::fit(test::spec(data(), Time::batches(7)).with_name("warmup"),
                               test::new_state(5, Time::batches(100))));
  const baton::CheckpointMeta meta{.run_name = "fashion", .config_fingerprint = "abc123", .stage_index = 2,
                                   .extra = {{"note", "a \"quoted\" value"}, {"host", "n\xc3\xa9"}}};
  REQUIRE(baton::save_checkpoint(s, dir.path / "c.baton", meta));
  const auto info = baton::read_checkpoint_info(dir.path / "c.baton");
  if (!info) FAIL(info.error().to_string());
  CHECK(info->format_version == 2);  // no loss scale: the oldest version that holds the state
  CHECK(info->meta.run_name == "fashion");
  CHECK(info->meta.config_fingerprint == "abc123");
  CHECK(info->meta.stage_index == 2);
  CHECK(info->meta.extra == meta.extra);
  CHECK(info->time == s.time);
  CHECK(info->stage == "warmup");
  CHECK(info->seed == 5);
  CHECK(info->max_duration == Time::batches(100));
  CHECK(info->params_sha256 == baton::params_sha256(s));
}

TEST_CASE("params_sha256 is a function of the parameters and buffers", "[checkpoint]") {
  TempDir dir;
  const auto sp = test::spec(data(), Time::batches(5));
  const auto s = ok(baton::fit(sp, test::new_state()));
  const auto h = baton::params_sha256(s);
  CHECK(h.size() == 64);
  CHECK(h.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(baton::params_sha256(baton::TrainState(s)) == h);
  CHECK(baton::params_sha256(reload(s, dir.path / "c.baton")) == h);
  CHECK(baton::params_sha256(ok(baton::fit(sp.with_name("more").with_duration(Time::batches(1)), s))) != h);
  CHECK(baton::params_sha256(test::new_state(1)) == baton::params_sha256(test::new_state(1)));
  CHECK(baton::params_sha256(test::new_state(1)) != baton::params_sha256(test::new_state(2)));
  // Buffers count: the same weights with other running statistics hash differently.
  auto other = s;
  other.named_buffers().front().second.add_(1);
  CHECK(baton::params_sha256(other) != h);

  // The documented encoding, computed by hand for Linear(2, 1).
  auto lin = baton::init_state(baton::model_factory([] { return torch::nn::Linear(2, 1); }), {});
  REQUIRE(lin);
  std::string bytes;
  for (const auto& [name, t] : lin->named_parameters()) {
    bytes += 'p';
    append_le(bytes, static_cast<std::uint64_t>(name.size()));
    bytes += name;
    append_le(bytes, std::uint64_t{7});
    bytes += "float32";
    append_le(bytes, static_cast<std::uint64_t>(t.dim()));
    for (auto n : t.sizes()) append_le(bytes, static_cast<std::int64_t>(n));
    append_le(bytes, static_cast<std::uint64_t>(t.numel() * 4));
    bytes.append(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.numel() * 4));
  }
  CHECK(baton::params_sha256(*lin) == hex(sha256(bytes)));
}

TEST_CASE("a missing, truncated, corrupt, newer or foreign checkpoint is a clear error", "[checkpoint][errors]") {
  TempDir dir;
  const auto s = ok(baton::fit(test::spec(data(), Time::batches(5)), test::new_state()));
  const auto good = dir.path / "good.baton", bad = dir.path / "bad.baton";
  REQUIRE(baton::save_checkpoint(s, good));
  const auto bytes = read_bytes(good);
  auto both = [&](const std::string& file_bytes, ErrorCode code, const std::string& text) {
    write_bytes(bad, file_bytes);
    require_error(load(bad), code, text);
    const auto info = baton::read_checkpoint_info(bad);
    REQUIRE_FALSE(info);
    CHECK(info.error().code == code);
    CHECK_THAT(info.error().message, Contains(text) && Contains(bad.string()));
  };

  SECTION("the file is framed exactly as docs/checkpoint.md says") {
    const auto parts = split(bytes);
    CHECK(parts.version == 2);  // version 3 only with a loss scale (precision_test.cpp)
    CHECK(frame(parts) == bytes);
    CHECK(nlohmann::json::parse(parts.header).at("stage") == "test");
  }
  SECTION("missing file") {
    require_error(load(dir.path / "nope.baton"), ErrorCode::io, (dir.path / "nope.baton").string());
    require_error(load(dir.path / "nope.baton"), ErrorCode::io, std::strerror(ENOENT));
    CHECK_FALSE(baton::read_checkpoint_info(dir.path / "nope.baton"));
    require_error(load(dir.path), ErrorCode::io, "not a regular file");
  }
  SECTION("truncated anywhere") {
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{10}, std::size_t{16},
                          std::size_t{100}, bytes.size() / 2, bytes.size() - 33, bytes.size() - 1}) {
      INFO("truncated to " << n << " of " << bytes.size() << " bytes");
      both(bytes.substr(0, n), ErrorCode::data, "truncated");
    }
  }
  SECTION("one flipped byte, anywhere after the framing, fails the checksum") {
    for (std::size_t at : {std::size_t{40}, bytes.size() / 2, bytes.size() - 40, bytes.size() - 1}) {
      INFO("byte " << at);
      auto flipped = bytes;
      flipped[at] = static_cast<char>(flipped[at] ^ 0x10);
      both(flipped, ErrorCode::data, "checksum mismatch: the file is corrupt");
    }
    both(bytes + "x", ErrorCode::data, "1 unexpected bytes after the checksum");
  }
  SECTION("a newer format version asks for a newer baton, checksum or not") {
    auto patched = bytes;
    const std::uint32_t v4 = 4;
    std::memcpy(patched.data() + 8, &v4, 4);
    both(patched, ErrorCode::data, "format version 4 is newer than this baton reads (version 3); upgrade baton");
    auto parts = split(bytes);
    parts.version = 4;
    both(frame(parts), ErrorCode::data, "format version 4 is newer");
  }
  SECTION("not a checkpoint") {
    both("PK\x03\x04 something else entirely", ErrorCode::data, "not a baton checkpoint");
  }
  SECTION("garbage lengths, even under a valid checksum, are errors, not allocations") {
    auto huge = bytes;
    const std::uint64_t big = std::numeric_limits<std::uint64_t>::max() - 3;
    std::memcpy(huge.data() + 12, &big, 8);  // the header length
    both(huge, ErrorCode::data, "truncated");

    auto with_header = [&](const std::function<void(nlohmann::json&)>& edit) {
      auto parts = split(bytes);
      auto h = nlohmann::json::parse(parts.header);
      edit(h);
      parts.header = h.dump();
      return frame(parts);
    };
    both(with_header([](auto& h) { h["tensors"][0]["shape"] = {std::int64_t{1} << 40, std::int64_t{1} << 40}; }),
         ErrorCode::data, "larger than the tensor data");
    both(with_header([](auto& h) {
           h["tensors"][0]["shape"] = {std::int64_t{1} << 62, 4};
           h["tensors"][0]["nbytes"] = 0;
         }),
         ErrorCode::data, "larger than the tensor data");
    both(with_header([](auto& h) { h["tensors"][0]["shape"] = {-1, 8}; }), ErrorCode::data, "negative dimension");
    both(with_header([](auto& h) { h["tensors"][1]["offset"] = 1u << 30; }), ErrorCode::data, "does not fit");
    both(with_header([](auto& h) { h["tensors"][0]["dtype"] = "float128"; }), ErrorCode::data, "unknown dtype");
    both(with_header([](auto& h) { h["tensors"][0]["group"] = "weights"; }), ErrorCode::data, "unknown tensor group");
    both(with_header([](auto& h) { h.erase("history"); }), ErrorCode::data, "malformed header");
    both(with_header([](auto& h) { h["seed"] = "seven"; }), ErrorCode::data, "malformed header");
    // Fields that parse but cannot be a point of a run (a valid checksum over nonsense).
    both(with_header([](auto& h) { h["time"]["sample_in_epoch"] = 1000000000; }), ErrorCode::data,
         "time is not a position a run can reach");
    both(with_header([](auto& h) { h["time"]["batch"] = -100; }), ErrorCode::data, "time has a negative counter");
    both(with_header([](auto& h) { h["time"]["epoch"] = std::int64_t{1} << 62; }), ErrorCode::data,
         "time is not a position a run can reach");
    both(with_header([](auto& h) { h["max_duration"] = "0ep"; }), ErrorCode::data,
         "max_duration \"0ep\" is not a positive count");
    both(with_header([](auto& h) { h["max_duration"] = "0.5dur"; }), ErrorCode::data, "is not a positive count");
    both(with_header([](auto& h) { h["meta"]["stage_index"] = -7; }), ErrorCode::data, "meta.stage_index -7 is below -1");
    both(with_header([](auto& h) {
           h["stage_start"] = h["time"];
           h["stage_start"]["batch"] = h["time"]["batch"].template get<std::int64_t>() + 1;
           h["stage_start"]["sample"] = h["time"]["sample"].template get<std::int64_t>() + 32;
         }),
         ErrorCode::data, "after the state's time");
    both(with_header([](auto& h) { h["optimizer"]["params"][0]["step"] = -3; }), ErrorCode::data, "is negative");
    auto parts = split(bytes);
    parts.header = "{\"meta\": [";
    both(frame(parts), ErrorCode::data, "not a JSON object");
  }
  SECTION("a checkpoint of another model lists every difference") {
    auto mlp = baton::init_state(baton::models::mlp({8, 5, 4}), {});
    REQUIRE(mlp);
    REQUIRE(baton::save_checkpoint(*mlp, bad));
    const auto r = load(bad);
    require_error(r, ErrorCode::shape_mismatch, bad.string());
    const auto& m = r.error().message;
    CHECK_THAT(m, Contains("parameter 0.weight [16, 8] is missing from the checkpoint"));
    CHECK_THAT(m, Contains("parameter 4.bias [4] is missing from the checkpoint"));
    CHECK_THAT(m, Contains("buffer 1.running_mean [16] is missing from the checkpoint"));
    CHECK_THAT(m, Contains("parameter 1.weight has shape [5, 8] in the checkpoint and [16] in the model"));
    CHECK_THAT(m, Contains("parameter 3.weight [4, 5] is in the checkpoint but not in the model"));
    CHECK_THAT(m, Contains("parameter 3.bias [4] is in the checkpoint but not in the model"));
    // Reading its header needs no model.
    CHECK(baton::read_checkpoint_info(bad));
  }
  // Whatever failed, the good file still loads.
  require_same_run(ok(load(good)), s);
}

TEST_CASE("a failed save is an io error that leaves the previous checkpoint intact", "[checkpoint][errors]") {
  TempDir dir;
  const auto target = dir.path / "ckpt.baton";
  const auto old_state = ok(baton::fit(test::spec(data(), Time::batches(3)), test::new_state()));
  REQUIRE(baton::save_checkpoint(old_state, target));
  const auto before = read_bytes(target);
  const auto newer = ok(baton::fit(test::spec(data(), Time::batches(3)), old_state));
  auto require_io = [](const baton::Expected<void>& r, const fs::path& path, int err) {
    REQUIRE_FALSE(r);
    INFO(r.error().to_string());
    CHECK(r.error().code == ErrorCode::io);
    CHECK_THAT(r.error().message, Contains(path.string()) && Contains(std::strerror(err)));
  };
  // Tests run as root, which ignores permissions: each failure is forced by the file system's shape.
  SECTION("the directory does not exist") {
    const auto nowhere = dir.path / "no" / "such" / "c.baton";
    require_io(baton::save_checkpoint(newer, nowhere), nowhere, ENOENT);
  }
  SECTION("the parent is a regular file") {
    require_io(baton::save_checkpoint(newer, target / "c.baton"), target / "c.baton", ENOTDIR);
  }
  SECTION("the temporary file cannot be created") {
    const auto tmp = dir.path / (".ckpt.baton.tmp-" + std::to_string(::getpid()));
    fs::create_directory(tmp);
    require_io(baton::save_checkpoint(newer, target), target, EISDIR);
    CHECK(fs::is_directory(tmp));  // not ours to remove
    fs::remove(tmp);
  }
  SECTION("a write comes up short: the file-size limit (ulimit -f), with SIGXFSZ's default action to end the process") {
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    const auto previous = std::signal(SIGXFSZ, SIG_DFL);  // the library holds the signal back on its own
    sigset_t mask_before{}, mask_after{};
    ::pthread_sigmask(SIG_SETMASK, nullptr, &mask_before);
    rlimit small = old;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const auto r = baton::save_checkpoint(newer, target);
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
    REQUIRE(before.size() > 4096);  // else the limit would not bite
    require_io(r, target, EFBIG);
    CHECK_THAT(r.error().message, Contains("the file-size limit, ulimit -f, is 4096 bytes"));
    // Nothing left behind: the signal mask as it was, no SIGXFSZ pending.
    ::pthread_sigmask(SIG_SETMASK, nullptr, &mask_after);
    CHECK(sigismember(&mask_after, SIGXFSZ) == sigismember(&mask_before, SIGXFSZ));
    sigset_t pending{};
    ::sigpending(&pending);
    CHECK_FALSE(sigismember(&pending, SIGXFSZ));
  }
  SECTION("the rename fails (a directory is in the way)") {
    const auto blocked = dir.path / "blocked.baton";
    fs::create_directories(blocked / "inside");
    require_io(baton::save_checkpoint(newer, blocked), blocked, EISDIR);
    CHECK(fs::is_directory(blocked / "inside"));
    fs::remove_all(blocked);
  }
  CHECK(read_bytes(target) == before);
  CHECK(dir.names() == std::vector<std::string>{"ckpt.baton"});  // the temporary file was removed
  require_same_run(ok(load(target)), old_state);
  // And a save that can succeed replaces it.
  REQUIRE(baton::save_checkpoint(newer, target));
  require_same_run(ok(load(target)), newer);
}
