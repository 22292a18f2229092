#pragma once
// A model of a user's own, named for the baton tools: the same factory for the C++ run that
// trains it (tests/cxx_run_tools_test.cpp) and for the program on baton::cli::main whose registry
// names it (tests/own_model_cli.cpp).
#include <cmath>

#include <torch/torch.h>

#include <baton/hparams.hpp>

namespace test {

/// Linear(8, width), ReLU, Linear(width, 4).
inline baton::ModelFactory own_tiny_net(std::int64_t width) {
  return baton::model_factory([width] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Linear(8, width), nn::ReLU(), nn::Linear(width, 4));
  });
}

/// The registry entry "tiny_net" (key `width`) a program on baton::cli::main adds.
inline baton::ModelEntry own_tiny_net_entry() {
  return {{"width"},
          [](const baton::Params& p) -> baton::Expected<baton::ModelFactory> {
            const auto it = p.find("width");
            const double* w = it == p.end() ? nullptr : std::get_if<double>(&it->second);
            if (!w || *w < 1 || *w != std::floor(*w))
              return baton::fail(baton::ErrorCode::invalid_argument, "model.width: a positive integer");
            return own_tiny_net(static_cast<std::int64_t>(*w));
          },
          "tiny_net: width"};
}

}  // namespace test
