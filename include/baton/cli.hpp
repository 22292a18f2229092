#pragma once
/// \file cli.hpp
/// The `baton` command line as a function, so a program with its own models and datasets gets
/// the same CLI:
///
/// ```cpp
/// int main(int argc, char** argv) {
///   auto registry = baton::Registry::builtin();
///   registry.models["my_net"] = {{"width"}, [](const baton::Params& p) -> baton::Expected<baton::ModelFactory> {
///     return baton::model_factory([] { return MyNet(); });
///   }, "my_net: width"};
///   return baton::cli::main(argc, argv, registry);
/// }
/// ```
///
/// Exit codes: 0 success; 1 training failed (non-finite loss, LibTorch error); 2 invalid input
/// (command line, config, data or checkpoint files); 3 interrupted (a checkpoint was written).
/// The constants are in exit_codes.hpp.
///
/// Every command but `launch` ignores SIGXFSZ in its process: a write past the file-size limit
/// (`ulimit -f`) is then an error that says so (exit 2, as a full disk), not a silent death.

#include "baton/exit_codes.hpp"
#include "baton/hparams.hpp"

namespace baton::cli {

/// Runs `baton run|sweep|validate|eval|inspect|export|predict|pack|report|launch` (and `--help`,
/// `--version`) with `argv`, as the `baton` program does: it first re-executes the program once
/// with the OpenMP thread policy (`relaunch_with_thread_policy`, runtime.hpp), holds SIGINT and
/// SIGTERM until a run's handler takes them (a signal while the program starts stops the run with
/// exit 3, as one later does), and names the program as typed (`argv[0]`) in its hints ("Resume
/// with: ./my_trainer run f.toml"). Call it first thing in `main`: the re-exec starts the process
/// anew. Link `baton::cli` (the same target name in baton's build tree and once installed).
int main(int argc, char** argv, const Registry& registry = Registry::builtin());

}  // namespace baton::cli
