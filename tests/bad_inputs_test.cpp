// The catalog of bad inputs (tests/bad_inputs/, table in docs/bad-inputs.md): every case runs the
// baton binary as a user would and must give its documented exit code and message, exit normally
// (no signal, no sanitizer report, no hang), and leave no partial file behind.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "helpers.hpp"

namespace fs = std::filesystem;

namespace {
const fs::path kCatalog = fs::path(BATON_SOURCE_DIR) / "tests" / "bad_inputs";
const fs::path kShared = kCatalog / "_shared";
const fs::path kDoc = fs::path(BATON_SOURCE_DIR) / "docs" / "bad-inputs.md";

/// One case: the directory's `case` file (`key: value` lines) and its input files.
struct Case {
  std::string id;  // the directory name
  std::map<std::string, std::string> fields;  // category, input, args, exit, message; setup, ulimit
  fs::path dir;
  const std::string& at(const std::string& key) const {
    auto it = fields.find(key);
    if (it == fields.end()) FAIL(fmt::format("{}/case: no \"{}:\" line", id, key));
    return it->second;
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<Case> load_catalog() {
  std::vector<Case> out;
  for (const auto& e : fs::directory_iterator(kCatalog)) {
    if (!e.is_directory() || e.path().filename().string().front() == '_') continue;
    Case c{e.path().filename().string(), {}, e.path()};
    std::istringstream in(read_text(e.path() / "case"));
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      const auto colon = line.find(": ");
      REQUIRE(colon != std::string::npos);
      c.fields[line.substr(0, colon)] = line.substr(colon + 2);
    }
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.id < b.id; });
  return out;
}

std::string substitute(std::string text, const std::string& key, const std::string& value) {
  for (auto at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
    text.replace(at, key.size(), value);
  return text;
}

std::string expand(const std::string& text, const fs::path& work) {
  return substitute(substitute(text, "{shared}", kShared.string()), "{dir}", work.string());
}

struct Outcome {
  bool exited = false;
  int code = -1;
  std::string out;
};

/// What runs before baton in the case's shell: `ulimit <limit>; ` where the case has an `ulimit:`
/// line (the file-size limit: `-f`, in /bin/sh's units), else nothing.
std::string shell_prefix(const Case& c) {
  const auto it = c.fields.find("ulimit");
  return it == c.fields.end() ? "" : fmt::format("ulimit {}; ", it->second);
}

/// Runs baton in `cwd` with `args` (shell words) after `prefix`, stdout and stderr together, at
/// most 120 s.
Outcome run_in(const fs::path& cwd, const std::string& args, const std::string& prefix = "") {
  const std::string cmd = fmt::format("cd '{}' && {}timeout -s KILL 120 {} {} 2>&1", cwd.string(), prefix, BATON_EXE, args);
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  Outcome o;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) o.out.append(buf.data(), n);
  const int status = ::pclose(p);
  o.exited = WIFEXITED(status);
  o.code = o.exited ? WEXITSTATUS(status) : -1;
  return o;
}

/// Files a failed write could leave behind: temporaries of atomic writes, and checkpoints written
/// by the run that do not verify (`inputs`: the case's own files, some of them bad on purpose).
std::vector<std::string> partial_files(const fs::path& work, const std::set<fs::path>& inputs) {
  std::vector<std::string> bad;
  for (const auto& e : fs::recursive_directory_iterator(work)) {
    std::error_code ec;
    if (!e.is_regular_file(ec) || inputs.count(e.path())) continue;
    const auto name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos) bad.push_back(e.path().string() + " (a temporary file)");
    if (e.path().extension() == ".baton")
      if (auto info = baton::read_checkpoint_info(e.path()); !info)
        bad.push_back(e.path().string() + " (" + info.error().message + ")");
  }
  return bad;
}

std::string markdown_cell(std::string s) {
  s = substitute(s, "|", "\\|");
  return s;
}

/// docs/bad-inputs.md, generated from the catalog (so the table cannot drift from the tests).
std::string render_doc(const std::vector<Case>& cases) {
  std::string md =
      "# Bad inputs: what baton says and how it exits\n\n"
      "<!-- Generated from tests/bad_inputs/ by scripts/bad-inputs-doc.sh; do not edit by hand. -->\n\n"
      "Every row is a test case (`baton_tests \"[bad_inputs]\"`): baton is run as written in *command*\n"
      "in a scratch copy of the case's directory (after the case's `setup` command, where it has one:\n"
      "symlink loops, FIFOs and directories cannot be kept in git; and under its `ulimit`, where it has one,\n"
      "in /bin/sh's units: dash counts `-f` in blocks of 512 bytes) and must exit with the code shown, print a message\n"
      "containing the text shown, end normally (no signal, no sanitizer report, within 120 s), and leave\n"
      "no partial file behind (no temporary files of atomic writes). `{shared}` is\n"
      "`tests/bad_inputs/_shared/`.\n\n"
      "Exit codes: 0 success; 1 training failed (non-finite loss with `on_non_finite = \"error\"`, a\n"
      "LibTorch error); 2 invalid input (command line, configuration, data or checkpoint files, a run\n"
      "directory in use); 3 interrupted (a checkpoint was written).\n\n"
      "| # | area | input | command | exit | message contains |\n"
      "|---|------|-------|---------|------|------------------|\n";
  int n = 0;
  for (const auto& c : cases)
    md += fmt::format("| {} | {} | {} | `{}baton {}` | {} | `{}` |\n", ++n, c.at("category"), markdown_cell(c.at("input")),
                      markdown_cell(shell_prefix(c)), markdown_cell(c.at("args")), c.at("exit"), markdown_cell(c.at("message")));
  md += fmt::format(
      "\n{} cases. Not in the table, tested in tests/run_lock_test.cpp (`[lock]`): a second `baton run`\n"
      "on a run directory that another run holds exits 2 naming the holder's pid, and a run killed\n"
      "with SIGKILL does not leave the directory locked. Circular references cannot be written: a\n"
      "stage inherits only from the stages before it, and datasets are named, not nested; missing\n"
      "references (datasets, eval sets, stages in `--set`) are cases above.\n",
      n);
  return md;
}
/// Runs every case of the catalog whose category is in `categories` as a user would (the table's
/// header in render_doc says what each must do). The catalog is split by category into a few
/// test cases so that CTest runs them in parallel: one case is a process start of `baton`, about
/// 4 s under ASan, and the 96 cases in one test took 7 minutes of a 2-core CI run.
void run_cases(const std::set<std::string>& categories) {
  const auto cases = load_catalog();
  REQUIRE(cases.size() >= 40);
  std::size_t ran = 0;
  for (const auto& c : cases) {
    if (!categories.count(c.at("category"))) continue;
    ++ran;
    SECTION(c.id) {
      const auto work = fs::temp_directory_path() / fmt::format("baton-bad-{}-{}", c.id, ::getpid());
      fs::remove_all(work);
      fs::create_directories(work);
      for (const auto& e : fs::directory_iterator(c.dir)) {
        if (e.path().filename() == "case") continue;
        const auto to = work / e.path().filename();
        if (e.path().extension() == ".toml") std::ofstream(to, std::ios::binary) << expand(read_text(e.path()), work);
        else fs::copy(e.path(), to, fs::copy_options::recursive);
      }
      // `setup:` makes what a directory of files cannot hold (symlink loops, FIFOs, directories
      // where baton writes files), by a shell command run in the scratch directory.
      if (const auto setup = c.fields.find("setup"); setup != c.fields.end())
        REQUIRE(std::system(fmt::format("cd '{}' && {}", work.string(), setup->second).c_str()) == 0);
      std::set<fs::path> inputs;
      for (const auto& e : fs::recursive_directory_iterator(work)) inputs.insert(e.path());
      const auto args = expand(c.at("args"), work);
      const auto o = run_in(work, args, shell_prefix(c));
      INFO("case " << c.id << ": " << shell_prefix(c) << "baton " << args << "\n" << o.out);
      CHECK(o.exited);
      CHECK(o.code == std::stoi(c.at("exit")));
      CHECK(o.out.find(expand(c.at("message"), work)) != std::string::npos);
      CHECK(o.out.find("Sanitizer") == std::string::npos);
      CHECK(o.out.find("runtime error:") == std::string::npos);
      CHECK(o.out.find("terminate called") == std::string::npos);
      CHECK(partial_files(work, inputs).empty());
      fs::remove_all(work);
    }
  }
  REQUIRE(ran > 0);
}

const std::set<std::string> kConfig{"config"};
const std::set<std::string> kData{"data"};
const std::set<std::string> kOthers{"cli", "checkpoint", "run", "optimization"};
}  // namespace

TEST_CASE("the bad-input catalog's config cases: exit code and message, no crash, no partial file", "[bad_inputs]") {
  run_cases(kConfig);
}

TEST_CASE("the bad-input catalog's data cases: exit code and message, no crash, no partial file", "[bad_inputs]") {
  run_cases(kData);
}

TEST_CASE("the bad-input catalog's cli, checkpoint, run and optimization cases: exit code and message, no crash, no partial file",
          "[bad_inputs]") {
  run_cases(kOthers);
}

TEST_CASE("every case of the bad-input catalog has a category one of the tests above runs", "[bad_inputs]") {
  for (const auto& c : load_catalog()) {
    INFO("case " << c.id << ", category " << c.at("category"));
    CHECK((kConfig.count(c.at("category")) + kData.count(c.at("category")) + kOthers.count(c.at("category"))) == 1);
  }
}

TEST_CASE("docs/bad-inputs.md is the table of the catalog (scripts/bad-inputs-doc.sh regenerates it)", "[bad_inputs][docs]") {
  const auto md = render_doc(load_catalog());
  if (const char* update = std::getenv("BATON_UPDATE_DOCS"); update && std::string(update) == "1")
    std::ofstream(kDoc, std::ios::binary) << md;
  CHECK(read_text(kDoc) == md);
}
