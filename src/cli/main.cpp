#include "baton/cli.hpp"
#include "baton/runtime.hpp"

int main(int argc, char** argv) {
  // OpenMP threads that sleep soon when they wait: a busy core elsewhere does not stall training
  // (runtime.hpp). Re-executes once with GOMP_SPINCOUNT=1000 unless the environment chose.
  baton::relaunch_with_thread_policy(argv);
  return baton::cli::main(argc, argv);
}
