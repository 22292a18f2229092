#include "baton/cli.hpp"

int main(int argc, char** argv) { return baton::cli::main(argc, argv); }
