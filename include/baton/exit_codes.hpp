#pragma once
/// \file exit_codes.hpp
/// The exit codes of the `baton` program (`baton::cli::main`, cli.hpp), also read by what starts
/// it as a child process (a sweep's nodes with `--jobs`): 0 success; 1 training failed
/// (non-finite loss, LibTorch error); 2 invalid input (command line, config, data or checkpoint
/// files); 3 interrupted (a checkpoint was written).

namespace baton::cli {

inline constexpr int exit_ok = 0;
inline constexpr int exit_training_failed = 1;
inline constexpr int exit_invalid_input = 2;
inline constexpr int exit_interrupted = 3;

}  // namespace baton::cli
