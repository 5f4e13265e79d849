// `sala <command>`: see src/cli/cmd_*.cpp for the commands.
#include <fmt/core.h>

#include <algorithm>
#include <map>

#include "cli/command.h"
#include "core/error.h"

namespace sala::cli {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace sala::cli

int main(int argc, char** argv) {
  using namespace sala::cli;
  CLI::App app{"SALA engine: MiniCPM-SALA inference server"};
  app.require_subcommand(1);
  auto& cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, Run> runs;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const sala::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 1;
}
