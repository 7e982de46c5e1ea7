// Command-line parsing shared by braid's tools: every usage error exits with code 2 and a
// message that starts with the tool's name and names the flag ("braidrun: The following
// argument was not expected: --bogus"), whatever CLI11's own exit code for it would be
// (CLI11 uses 100 and up: 105 for an unknown flag, 106 for a value that does not convert,
// ...); --help and --version exit 0.
#ifndef BRAID_TOOLS_CLI_H_
#define BRAID_TOOLS_CLI_H_

#include <memory>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"

namespace braid::tools {

inline constexpr int kUsageError = 2;

// The tool's name for messages: the last component of the program path CLI11 keeps.
inline std::string ToolName(const CLI::App& app) {
  const std::string& path = app.get_name();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// CLI11's app.exit(error) mapped onto braid's exit codes; a usage error is printed as
// "TOOL: MESSAGE" ("braidrun: --np: Value 1.5 could not be converted") with CLI11's hint.
inline int ExitCodeFor(CLI::App& app, const CLI::ParseError& e) {
  app.failure_message([](const CLI::App* a, const CLI::Error& error) {
    return ToolName(*a) + ": " + CLI::FailureMessage::simple(a, error);
  });
  return app.exit(e) == 0 ? 0 : kUsageError;
}

// CLI11 (2.1) writes its own "Usage: NAME [OPTIONS]" line under the description; a tool
// whose usage says more (braidrun's COMMAND) gives it here, so --help shows one usage line.
class UsageFormatter : public CLI::Formatter {
 public:
  explicit UsageFormatter(std::string usage) : usage_(std::move(usage)) {}
  std::string make_usage(const CLI::App*, std::string) const override {
    return get_label("Usage") + ": " + usage_ + "\n";
  }

 private:
  std::string usage_;
};

inline void SetUsage(CLI::App& app, std::string usage) {
  app.formatter(std::make_shared<UsageFormatter>(std::move(usage)));
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
