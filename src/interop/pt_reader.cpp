// Reads a state_dict that Python's torch.save wrote (the zip format, PyTorch >= 1.6): the pickle
// in data.pkl and the tensor data in data/<key>.
//
// Why a reader of our own: LibTorch's torch::pickle_load turns every collections.OrderedDict into
// None (it expects them only as a tensor's empty backward hooks), and model.state_dict() is an
// OrderedDict, so the very file users save fails to load. This reader interprets the few pickle
// opcodes torch.save emits, allows only the globals a state_dict needs (no code runs, nothing
// else is built), and checks every length against the data: a damaged or hostile file is an
// error that says where.
#include "detail.hpp"
#include "interop/internal.hpp"
#include "interop/zip_check.hpp"

#include <cstring>
#include <memory>
#include <variant>

#include <caffe2/serialize/inline_container.h>
#if defined(__SANITIZE_ADDRESS__)  // GCC's -fsanitize=address
#define BATON_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)  // clang's
#define BATON_LSAN 1
#endif
#endif
#ifdef BATON_LSAN
#include <sanitizer/lsan_interface.h>
#endif
#include <fmt/format.h>
#include <torch/torch.h>

namespace baton::detail {
namespace {

struct Value;
using Ref = std::shared_ptr<Value>;

struct Global {
  std::string module, name;
};
struct Storage {
  c10::ScalarType dtype;
  std::string key;
  std::int64_t numel;
};
struct Tuple {
  std::vector<Ref> items;
};
struct List {
  std::vector<Ref> items;
};
struct Dict {
  std::vector<std::pair<Ref, Ref>> items;
};
struct PickleMark {};

struct Value {
  std::variant<std::monostate, bool, std::int64_t, double, std::string, Global, Storage, Tuple, List, Dict, torch::Tensor, PickleMark> v;
};

Ref make(auto x) { return std::make_shared<Value>(Value{std::move(x)}); }

const std::map<std::string, c10::ScalarType>& storage_types() {
  static const std::map<std::string, c10::ScalarType> types = {
      {"FloatStorage", c10::kFloat}, {"DoubleStorage", c10::kDouble}, {"HalfStorage", c10::kHalf},
      {"BFloat16Storage", c10::kBFloat16}, {"LongStorage", c10::kLong}, {"IntStorage", c10::kInt},
      {"ShortStorage", c10::kShort}, {"CharStorage", c10::kChar}, {"ByteStorage", c10::kByte},
      {"BoolStorage", c10::kBool}};
  return types;
}

class Reader {
 public:
  Reader(const char* data, std::size_t size, caffe2::serialize::PyTorchStreamReader& zip, std::string file)
      : p_(data), end_(data + size), zip_(zip), file_(std::move(file)) {}

  Ref run() {
    while (true) {
      const auto op = static_cast<unsigned char>(byte());
      switch (op) {
        case 0x80: byte(); break;  // PROTO
        case '.': return pop();    // STOP
        case '(': stack_.push_back(make(PickleMark{})); break;
        case 'N': stack_.push_back(make(std::monostate{})); break;
        case 0x88: stack_.push_back(make(true)); break;
        case 0x89: stack_.push_back(make(false)); break;
        case 'K': stack_.push_back(make(static_cast<std::int64_t>(static_cast<unsigned char>(byte())))); break;
        case 'M': stack_.push_back(make(static_cast<std::int64_t>(le<std::uint16_t>()))); break;
        case 'J': stack_.push_back(make(static_cast<std::int64_t>(le<std::int32_t>()))); break;
        case 0x8a: stack_.push_back(make(long1())); break;
        case 'G': stack_.push_back(make(binfloat())); break;
        case 'X': stack_.push_back(make(text(le<std::uint32_t>()))); break;
        case 0x8c: stack_.push_back(make(text(static_cast<unsigned char>(byte())))); break;  // SHORT_BINUNICODE
        case 'c': {
          auto module = line(), name = line();
          stack_.push_back(make(Global{std::move(module), std::move(name)}));
          break;
        }
        case 'q': memo(static_cast<unsigned char>(byte())); break;
        case 'r': memo(le<std::uint32_t>()); break;
        case 'h': get(static_cast<unsigned char>(byte())); break;
        case 'j': get(le<std::uint32_t>()); break;
        case ')': stack_.push_back(make(Tuple{})); break;
        case 0x85: tuple(1); break;
        case 0x86: tuple(2); break;
        case 0x87: tuple(3); break;
        case 't': stack_.push_back(make(Tuple{since_mark()})); break;
        case ']': stack_.push_back(make(List{})); break;
        case 'a': { auto x = pop(); list().items.push_back(std::move(x)); break; }
        case 'e': { auto xs = since_mark(); auto& l = list(); l.items.insert(l.items.end(), xs.begin(), xs.end()); break; }
        case '}': stack_.push_back(make(Dict{})); break;
        case 's': { auto v = pop(), k = pop(); dict().items.emplace_back(std::move(k), std::move(v)); break; }
        case 'u': {
          auto xs = since_mark();
          if (xs.size() % 2) fail_at("SETITEMS with an odd number of items");
          auto& d = dict();
          for (std::size_t i = 0; i < xs.size(); i += 2) d.items.emplace_back(xs[i], xs[i + 1]);
          break;
        }
        case 'Q': stack_.push_back(persistent(pop())); break;
        case 'R': { auto args = pop(), f = pop(); stack_.push_back(reduce(*f, *args)); break; }
        case 'b': pop(); break;  // BUILD: an OrderedDict's _metadata (module versions): not needed
        default: fail_at(fmt::format("pickle opcode 0x{:02x}, which a state_dict does not use", op));
      }
    }
  }

 private:
  [[noreturn]] void fail_at(const std::string& what) const {
    throw BatonException(Error{ErrorCode::data,
                               fmt::format("{}: data.pkl at byte {}: {}", file_, p_ - begin(), what), {}});
  }
  const char* begin() const { return end_ - size_; }
  char byte() {
    if (p_ >= end_) fail_at("the pickle ends early");
    return *p_++;
  }
  const char* take(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) fail_at("the pickle ends early");
    const char* at = p_;
    p_ += n;
    return at;
  }
  template <class T>
  T le() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));  // little-endian hosts (as the checkpoint format)
    return v;
  }
  std::int64_t long1() {
    const auto n = static_cast<unsigned char>(byte());
    if (n > 8) fail_at(fmt::format("an integer of {} bytes", n));
    const char* b = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80)) v |= ~std::uint64_t{0} << (8 * n);  // sign
    return static_cast<std::int64_t>(v);
  }
  double binfloat() {
    const char* b = take(8);
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = bits << 8 | static_cast<unsigned char>(b[i]);  // big-endian
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  std::string text(std::size_t n) { return {take(n), n}; }
  std::string line() {
    const char* start = p_;
    while (byte() != '\n') {}
    return {start, static_cast<std::size_t>(p_ - start - 1)};
  }
  Ref pop() {
    if (stack_.empty()) fail_at("the pickle's stack is empty");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    if (std::holds_alternative<PickleMark>(v->v)) fail_at("a MARK where a value belongs");
    return v;
  }
  std::vector<Ref> since_mark() {
    std::vector<Ref> out;
    while (true) {
      if (stack_.empty()) fail_at("no MARK on the stack");
      auto v = std::move(stack_.back());
      stack_.pop_back();
      if (std::holds_alternative<PickleMark>(v->v)) break;
      out.push_back(std::move(v));
    }
    return {out.rbegin(), out.rend()};
  }
  void tuple(std::size_t n) {
    std::vector<Ref> xs(n);
    for (std::size_t i = n; i-- > 0;) xs[i] = pop();
    stack_.push_back(make(Tuple{std::move(xs)}));
  }
  template <class T>
  T& top_as(const char* what) {
    if (stack_.empty() || !std::holds_alternative<T>(stack_.back()->v)) fail_at(fmt::format("{} without one below", what));
    return std::get<T>(stack_.back()->v);
  }
  List& list() { return top_as<List>("APPEND to a list"); }
  Dict& dict() { return top_as<Dict>("SETITEM to a dict"); }
  void memo(std::size_t i) {
    if (stack_.empty()) fail_at("PUT with an empty stack");
    if (i > 1'000'000) fail_at("a memo index beyond any state_dict's");
    if (memo_.size() <= i) memo_.resize(i + 1);
    memo_[i] = stack_.back();
  }
  void get(std::size_t i) {
    if (i >= memo_.size() || !memo_[i]) fail_at(fmt::format("GET of memo {}, never PUT", i));
    stack_.push_back(memo_[i]);
  }

  /// ('storage', torch.FloatStorage, key, location, numel): the record data/<key>.
  Ref persistent(const Ref& id) {
    const auto* t = std::get_if<Tuple>(&id->v);
    if (!t || t->items.size() < 5 || !std::holds_alternative<std::string>(t->items[0]->v) ||
        std::get<std::string>(t->items[0]->v) != "storage")
      fail_at("a persistent id that is not a tensor storage");
    const auto* type = std::get_if<Global>(&t->items[1]->v);
    const auto* key = std::get_if<std::string>(&t->items[2]->v);
    const auto* numel = std::get_if<std::int64_t>(&t->items[4]->v);
    if (!type || !key || !numel || *numel < 0) fail_at("a storage without type, key or size");
    const auto dtype = storage_types().find(type->name);
    if (type->module != "torch" || dtype == storage_types().end())
      fail_at(fmt::format("a storage of type {}.{}", type->module, type->name));
    return make(Storage{dtype->second, *key, *numel});
  }

  torch::Tensor tensor(const Storage& s) {
    auto& cached = storages_[s.key];
    if (cached.defined()) return cached;
    const std::string record = "data/" + s.key;
    if (!zip_.hasRecord(record)) fail_at(fmt::format("the tensor data {} is missing from the archive", record));
    auto [data, bytes] = zip_.getRecord(record);
    const auto need = static_cast<std::size_t>(s.numel) * c10::elementSize(s.dtype);
    if (bytes != need) fail_at(fmt::format("{} holds {} bytes; its storage needs {}", record, bytes, need));
    cached = torch::empty({s.numel}, torch::TensorOptions().dtype(s.dtype));
    if (need) std::memcpy(cached.data_ptr(), data.get(), need);
    return cached;
  }

  std::vector<std::int64_t> ints(const Ref& r, const char* what) {
    const auto* t = std::get_if<Tuple>(&r->v);
    if (!t) fail_at(fmt::format("a tensor's {} is not a tuple", what));
    std::vector<std::int64_t> out;
    for (const auto& x : t->items) {
      const auto* i = std::get_if<std::int64_t>(&x->v);
      if (!i || *i < 0) fail_at(fmt::format("a tensor's {} holds a value that is not a size", what));
      out.push_back(*i);
    }
    return out;
  }

  /// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...), with every view checked
  /// to lie inside its storage.
  Ref rebuild_tensor(const Tuple& a) {
    if (a.items.size() < 4) fail_at("_rebuild_tensor_v2 with too few arguments");
    const auto* s = std::get_if<Storage>(&a.items[0]->v);
    const auto* offset = std::get_if<std::int64_t>(&a.items[1]->v);
    if (!s || !offset || *offset < 0) fail_at("_rebuild_tensor_v2 without a storage and offset");
    const auto size = ints(a.items[2], "size"), stride = ints(a.items[3], "stride");
    if (size.size() != stride.size()) fail_at("a tensor's size and stride differ in length");
    if (size.size() > 64) fail_at(fmt::format("a tensor of {} dimensions", size.size()));
    std::int64_t last = *offset;
    bool empty = false;
    for (std::size_t i = 0; i < size.size(); ++i) {
      empty = empty || size[i] == 0;
      if (size[i] > 0 && stride[i] > (std::int64_t{1} << 40) / size[i]) fail_at("a tensor's stride is out of range");
      if (size[i] > 0) last += (size[i] - 1) * stride[i];
    }
    if (!empty && last >= s->numel) fail_at(fmt::format("a tensor reaches element {} of a storage of {}", last, s->numel));
    return make(tensor(*s).as_strided(size, stride, *offset).clone());
  }

  Ref reduce(const Value& f, const Value& args) {
    const auto* g = std::get_if<Global>(&f.v);
    const auto* a = std::get_if<Tuple>(&args.v);
    if (!g || !a) fail_at("REDUCE of something that is not a known function");
    if (g->module == "collections" && g->name == "OrderedDict") return make(Dict{});
    // LibTorch's own pickler (torch::pickle_save) tags a typed dict: restore_type_tag(dict, "Dict[str, Tensor]").
    if (g->module == "torch.jit._pickle" && g->name == "restore_type_tag" && !a->items.empty()) return a->items[0];
    if (g->module == "torch._utils" && g->name == "_rebuild_tensor_v2") return rebuild_tensor(*a);
    if (g->module == "torch._utils" && g->name == "_rebuild_parameter") {
      if (a->items.empty() || !std::holds_alternative<torch::Tensor>(a->items[0]->v)) fail_at("_rebuild_parameter without a tensor");
      return a->items[0];
    }
    fail_at(fmt::format("{}.{}: not part of a state_dict (only tensors by name are read)", g->module, g->name));
  }

  const char* p_;
  const char* end_;
  std::size_t size_ = static_cast<std::size_t>(end_ - p_);
  caffe2::serialize::PyTorchStreamReader& zip_;
  std::string file_;
  std::vector<Ref> stack_, memo_;
  std::map<std::string, torch::Tensor> storages_;
};
}  // namespace

Expected<std::unique_ptr<caffe2::serialize::PyTorchStreamReader>> open_archive(const std::filesystem::path& file,
                                                                                std::string_view what) {
#ifdef BATON_LSAN
  // LibTorch 1.13's PyTorchStreamReader leaks miniz's buffers when its constructor throws on a
  // damaged archive (after miniz opened it, e.g. an unreadable version record): the reader's
  // destructor, which frees them, never runs. Not baton's leak (found by fuzz_artifact); LSan
  // ignores what LibTorch allocates here, so that the sanitizer builds still find baton's leaks.
  __lsan::ScopedDisabler lsan_off;
#endif
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(file.string());
  } catch (const c10::Error& e) {
    return fail(ErrorCode::data, fmt::format("{}: not {} (a zip archive of data.pkl and tensor records): {}", file.string(), what,
                                             torch_message(e)));
  }
  // LibTorch's reader checks no CRC: without this, a flipped byte of a tensor loads as another weight.
  if (auto ok = check_zip_records(file); !ok) return tl::unexpected(ok.error());
  return reader;
}

Expected<StateDict> read_torch_save(const std::filesystem::path& file) {
  return guard([&]() -> Expected<StateDict> {
    auto opened = open_archive(file, "a file torch.save wrote");
    if (!opened) return tl::unexpected(opened.error());
    auto& zip = *opened;
    if (!zip->hasRecord("data.pkl"))
      return fail(ErrorCode::data, fmt::format("{}: the archive has no data.pkl (a TorchScript module? "
                                                             "save model.state_dict() instead)", file.string()));
    auto [data, size] = zip->getRecord("data.pkl");
    Reader r(static_cast<const char*>(data.get()), size, *zip, file.string());
    const Ref top = r.run();
    const auto* d = std::get_if<Dict>(&top->v);
    if (!d) return fail(ErrorCode::invalid_argument, fmt::format("{}: holds no dict of tensors (a state_dict)", file.string()));
    StateDict out;
    for (const auto& [k, v] : d->items) {
      const auto* name = std::get_if<std::string>(&k->v);
      const auto* t = std::get_if<torch::Tensor>(&v->v);
      if (!name || !t)
        return fail(ErrorCode::invalid_argument,
                    fmt::format("{}: an entry {} is not a tensor by name (a checkpoint dict? save model.state_dict())",
                                file.string(), name ? "\"" + *name + "\"" : std::string("without a text key")));
      out.emplace_back(*name, *t);
    }
    return out;
  });
}

}  // namespace baton::detail
