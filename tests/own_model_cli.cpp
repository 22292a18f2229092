// A program on baton::cli::main with a model of its own ("tiny_net"): the `baton` command line for
// run directories of C++ runs that name that model (tests/cxx_run_tools_test.cpp).
#include <baton/cli.hpp>

#include "own_model.hpp"

int main(int argc, char** argv) {
  auto registry = baton::Registry::builtin();
  registry.models["tiny_net"] = test::own_tiny_net_entry();
  return baton::cli::main(argc, argv, registry);
}
