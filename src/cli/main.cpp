// `baton-core`: the command line. Users start it through `baton` (src/cli/launcher.cpp), which
// holds SIGINT/SIGTERM and sets the thread policy before LibTorch loads; started directly, it
// does both itself from main on (baton::cli::main), a second or so later.
#include "baton/cli.hpp"

int main(int argc, char** argv) { return baton::cli::main(argc, argv); }
