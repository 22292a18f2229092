// Text corpora, their split, the byte tokenizer and the text datasets (text.hpp).
#include "baton/text.hpp"

#include <algorithm>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "detail.hpp"
#include "io.hpp"

namespace baton::text {
namespace fs = std::filesystem;

namespace {

/// Length of the UTF-8 sequence starting at s[i] when it is well formed (no overlong forms, no
/// surrogates, at most U+10FFFF), else 0.
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// Overstrikes print one character where several were typed: a backspace moves back one
/// character, and what follows is struck over what is there ("_\bx" underlines, "x\bx" is bold,
/// "____\b\b\b\bword" underlines a word). The printed character is kept: an underscore struck
/// over a letter, or a letter over an underscore, leaves the letter; otherwise the later one wins.
/// Works per line on UTF-8 characters (a backspace after "ü" steps over both of its bytes).
std::string clean_overstrikes(std::string_view s, bool& had) {
  if (s.find('\b') == std::string_view::npos) return std::string(s);
  had = true;
  std::string out;
  std::vector<std::string> cells;  // the characters of the current line
  std::size_t cursor = 0;
  auto flush = [&] {
    for (const auto& c : cells) out += c;
    cells.clear(), cursor = 0;
  };
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '\n') {
      flush();
      out += '\n', ++i;
      continue;
    }
    if (s[i] == '\b') {
      cursor = cursor > 0 ? cursor - 1 : 0, ++i;
      continue;
    }
    std::size_t end = i + 1;
    while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
    std::string c(s.substr(i, end - i));
    i = end;
    if (cursor < cells.size()) {
      if (c != "_") cells[cursor] = std::move(c);
    } else {
      cells.push_back(std::move(c));
    }
    ++cursor;
  }
  flush();
  return out;
}

/// Trailing whitespace of each line and blank lines at both ends removed.
std::string tidy(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.pop_back();
    lines.push_back(std::move(line));
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  std::size_t first = 0;
  while (first < lines.size() && lines[first].empty()) ++first;
  std::string out;
  for (std::size_t i = first; i < lines.size(); ++i) out += (i > first ? "\n" : "") + lines[i];
  return out;
}

/// The topic files of a language directory: regular files, not links, `.dat` or `.u8`, by name.
std::vector<fs::path> topic_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto ext = e.path().extension().string();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

Expected<Corpus> parse_records(const std::string& text, const std::string& source, const std::string& language,
                               const std::string& topic, bool skip_undecodable) {
  Corpus out;
  std::string record;
  std::int64_t line_no = 0, first_line = 1;
  auto finish = [&]() -> Expected<void> {
    bool had = false;
    auto cleaned = tidy(clean_overstrikes(record, had));
    record.clear();
    out.overstrikes += had ? 1 : 0;
    if (!valid_utf8(cleaned)) {
      if (!skip_undecodable)
        return fail(ErrorCode::data,
                    fmt::format("{}:{}: the record is not UTF-8; convert the file (iconv), or skip such records "
                                "(skip_undecodable = true)", source, first_line));
      ++out.undecodable;
      return {};
    }
    if (cleaned.empty()) {
      ++out.empty;
      return {};
    }
    out.records.push_back(Record{std::move(cleaned), language, topic});
    return {};
  };
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line == "%" || line == "%\r") {
      if (auto ok = finish(); !ok) return tl::unexpected(ok.error());
      first_line = line_no + 1;
      continue;
    }
    record += line;
    record += '\n';
  }
  // After the last '%': a record only when something is there (a file ends with "%\n").
  if (record.find_first_not_of(" \t\r\n") != std::string::npos)
    if (auto ok = finish(); !ok) return tl::unexpected(ok.error());
  return out;
}

Expected<Corpus> fortunes(const FortunesOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec))
    return fail(ErrorCode::io, fmt::format("{}: no fortune databases there; install the Debian package fortunes "
                                                 "(and fortunes-de, -es, -it, -ru, -pl for other languages)",
                                                 o.dir.string()));
  if (o.languages.empty()) return fail(ErrorCode::invalid_argument, "fortunes: no languages given");
  Corpus all;
  std::unordered_set<std::string> seen;
  for (const auto& lang : o.languages) {
    const fs::path dir = lang == "en" ? o.dir : o.dir / lang;
    if (lang.empty() || lang.find('/') != std::string::npos || !fs::is_directory(dir, ec))
      return fail(ErrorCode::io, fmt::format("fortunes: no language \"{}\" in {} (install fortunes-{})", lang,
                                                   o.dir.string(), lang));
    auto files = topic_files(dir);
    if (!o.topics.empty()) {
      std::vector<fs::path> chosen;
      for (const auto& t : o.topics) {
        auto it = std::find_if(files.begin(), files.end(), [&](const fs::path& p) { return p.filename() == t; });
        if (it == files.end())
          return fail(ErrorCode::invalid_argument, fmt::format("fortunes: no topic \"{}\" in {}", t, dir.string()));
        chosen.push_back(*it);
      }
      files = std::move(chosen);
    }
    for (const auto& f : files) {
      auto text = baton::detail::read_file(f, "fortune file");
      if (!text) return tl::unexpected(text.error());
      auto part = parse_records(*text, f.string(), lang, f.filename().string(), o.skip_undecodable);
      if (!part) return tl::unexpected(part.error());
      ++all.files;
      all.undecodable += part->undecodable, all.overstrikes += part->overstrikes, all.empty += part->empty;
      for (auto& r : part->records) {
        if (!seen.insert(r.text).second) {
          ++all.duplicates;
          continue;
        }
        all.records.push_back(std::move(r));
      }
    }
  }
  if (all.records.empty())
    return fail(ErrorCode::invalid_argument, fmt::format("fortunes: no records in {} for languages {}", o.dir.string(),
                                                         fmt::join(o.languages, ", ")));
  return all;
}

std::vector<Record> split(const Corpus& corpus, Part part, const SplitOptions& o) {
  std::vector<Record> out;
  for (const auto& r : corpus.records) {
    std::uint64_t h = fnv1a(r.text);
    const double u = static_cast<double>(detail::splitmix64(h) >> 11) * 0x1.0p-53;  // in [0, 1)
    const Part p = u < o.test ? Part::test : u < o.test + o.val ? Part::val : Part::train;
    if (p == part) out.push_back(r);
  }
  return out;
}

std::vector<std::int64_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<std::int64_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

Expected<std::string> ByteTokenizer::decode(const std::vector<std::int64_t>& tokens) {
  std::string out;
  for (const auto t : tokens) {
    if (t < 0 || t >= vocab_size)
      return fail(ErrorCode::invalid_argument,
                  fmt::format("token {} is outside the byte tokenizer's vocabulary [0, {})", t, vocab_size));
    if (t == end_of_text) out += '\n';
    else if (t < 256) out += static_cast<char>(t);
  }
  return out;
}

std::vector<std::string> labels_with(const std::vector<Record>& records, const std::string& label, std::int64_t min_records) {
  std::map<std::string, std::int64_t> counts;
  for (const auto& r : records) ++counts[label == "language" ? r.language : r.topic];
  std::vector<std::string> out;
  for (const auto& [name, n] : counts)
    if (n >= min_records) out.push_back(name);
  return out;
}

}  // namespace baton::text
