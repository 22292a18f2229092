#pragma once
// What the command line's files share: how an error is reported, and the commands on a saved
// state (state_commands.cpp).
#include <string>
#include <vector>

#include "baton/cli.hpp"
#include "baton/error.hpp"
#include "baton/hparams.hpp"

namespace baton::cli {
/// The exit status for an error: training failures 1, bad input 2.
int exit_code_for(const Error& e);
/// Prints "baton: <error>" to stderr; returns its exit status.
int report(const Error& e);

/// `baton eval`: the loss and metrics of a saved state on a dataset of its config, as JSON.
int evaluate(const std::string& state_path, const std::string& data, std::string config,
             const std::vector<std::string>& metric_names, const Registry& registry);
/// `baton inspect`: a checkpoint's header as JSON.
int inspect(const std::string& path);
/// `baton export`: a saved state's weights as a state_dict file for Python's torch.load.
int export_weights(const std::string& state_path, const std::string& out, const std::string& weights, std::string config,
                   const Registry& registry);
}  // namespace baton::cli
