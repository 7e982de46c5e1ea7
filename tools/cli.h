// Command-line parsing shared by braid's tools: every usage error exits with code 2 and a
// message naming the flag, whatever CLI11's own exit code for it would be (CLI11 uses 100
// and up: 105 for an unknown flag, 106 for a value that does not convert, ...); --help and
// --version exit 0.
#ifndef BRAID_TOOLS_CLI_H_
#define BRAID_TOOLS_CLI_H_

#include "CLI/CLI.hpp"

namespace braid::tools {

inline constexpr int kUsageError = 2;

// CLI11's app.exit(error) (prints the message: "--np: Value 1.5 could not be converted"),
// mapped onto braid's exit codes.
inline int ExitCodeFor(CLI::App& app, const CLI::ParseError& e) {
  return app.exit(e) == 0 ? 0 : kUsageError;
}

}  // namespace braid::tools

// Like CLI11_PARSE: parses or returns from the calling function (main) with the exit code.
#define BRAID_CLI_PARSE(app, argc, argv)                  \
  do {                                                    \
    try {                                                 \
      (app).parse((argc), (argv));                        \
    } catch (const CLI::ParseError& braid_cli_error_) {   \
      return ::braid::tools::ExitCodeFor((app), braid_cli_error_); \
    }                                                     \
  } while (0)

#endif  // BRAID_TOOLS_CLI_H_
