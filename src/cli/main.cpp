// `sala <command>`: see src/cli/cmd_*.cpp for the commands.
#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
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
  // OpenMP threads that spin-wait between parallel regions starve the HTTP threads and
  // anything else on a small machine (docs/PERF_LOG.md has the measurement). libgomp reads
  // the policy before main, so set it and re-exec once; an explicit OMP_WAIT_POLICY from the
  // user is kept.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as is
  }
  using namespace sala::cli;
  CLI::App app{"SALA engine: MiniCPM-SALA inference server"};
  app.require_subcommand(1);
  auto& cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  // A name with a space ("bench offline") is a subcommand of a subcommand; the deepest
  // parsed command runs.
  std::vector<std::pair<CLI::App*, Run>> runs;
  for (auto& c : cmds) {
    CLI::App* parent = &app;
    std::string leaf = c.name;
    if (auto sp = c.name.find(' '); sp != std::string::npos) {
      const std::string head = c.name.substr(0, sp);
      leaf = c.name.substr(sp + 1);
      CLI::App* existing = nullptr;
      for (auto* s : app.get_subcommands({})) if (s->get_name() == head) existing = s;
      if (!existing) {
        existing = app.add_subcommand(head, head + " commands");
        existing->require_subcommand(1);
      }
      parent = existing;
    }
    CLI::App* sub = parent->add_subcommand(leaf, c.help);
    runs.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto it = runs.rbegin(); it != runs.rend(); ++it)
      if (it->first->parsed() && it->first->get_subcommands().empty()) return it->second();
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const sala::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 1;
}
